"""Build a member's data directory for a NEW cluster from a state image (etcdctl's
``snapshot restore``; also the last step of point-in-time restore).

``build_data_dir(image, target)`` writes ``<data-dir>/member/snap/*.snap`` and
``<data-dir>/member/wal/`` so that ``raftkv serve`` with the same ``--name``,
``--initial-cluster`` and ``--initial-cluster-token`` starts from the image:

* member IDs and the cluster ID are derived from the flags (as a fresh ``serve`` derives
  them): a restored cluster is a new cluster and its members refuse peers of the old one;
* the raft snapshot is at index ``len(members)``, term 1, with every member of
  ``--initial-cluster`` a voter (etcd puts its restored snapshot at the same place), and its
  data is the member-registry frame (built from the flags) + the image; the old membership
  is not carried over;
* the WAL holds that snapshot's record and hard state ``{term 1, commit index}``.

Every member of the new cluster is restored from the same image with its own ``--name``.
The directory is built under ``<data-dir>.restoring`` and renamed into place, so a failed
restore leaves nothing that ``serve`` would start from. An existing ``<data-dir>/member`` is
refused (``ArchiveError``), as etcdctl refuses an existing data dir.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import raftpb
import snap
import wal
from kvserver.archive.store import ArchiveError
from kvserver.membership.identity import (
    ClusterConfigError,
    cluster_id,
    encode_metadata,
    parse_initial_cluster,
)
from kvserver.membership.registry import MemberRegistry, frame_members
from raft import ConfState


@dataclass(frozen=True)
class RestoreTarget:
    data_dir: str
    name: str
    initial_cluster: str
    initial_cluster_token: str = "raftkv-cluster"
    initial_advertise_peer_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class RestoredMember:
    data_dir: str
    member_id: int
    cluster_id: int
    index: int


def build_data_dir(image: bytes | bytearray, target: RestoreTarget) -> RestoredMember:
    try:
        members = parse_initial_cluster(target.initial_cluster, target.initial_cluster_token)
    except ClusterConfigError as exc:
        raise ArchiveError(str(exc)) from None
    local = next((m for m in members if m.name == target.name), None)
    if local is None:
        raise ArchiveError(f"--name {target.name!r} is not in --initial-cluster")
    if target.initial_advertise_peer_urls and set(target.initial_advertise_peer_urls) != set(
        local.peer_urls
    ):
        raise ArchiveError(
            f"--initial-advertise-peer-urls {','.join(target.initial_advertise_peer_urls)} do "
            f"not match {target.name}'s entry in --initial-cluster ({','.join(local.peer_urls)})"
        )
    data_dir = os.path.abspath(target.data_dir)
    if os.path.exists(os.path.join(data_dir, "member")):
        raise ArchiveError(
            f"{data_dir}/member already exists: restore into a new data "
            f"directory (refusing to overwrite a member's data)"
        )
    ids = tuple(sorted(m.id for m in members))
    cid = cluster_id(ids)
    conf = ConfState(voters=ids)
    registry = MemberRegistry(members)
    registry.reconcile(conf)
    index, term = len(ids), 1
    data = frame_members(registry.snapshot()) + bytes(image)

    tmp = data_dir + ".restoring"
    shutil.rmtree(tmp, ignore_errors=True)
    member_dir = os.path.join(tmp, "member")
    os.makedirs(member_dir)
    pb_conf = raftpb.ConfState(voters=ids)
    snap.Snapshotter(os.path.join(member_dir, "snap")).save_snap(
        raftpb.Snapshot(data, raftpb.SnapshotMetadata(pb_conf, index, term))
    )
    w = wal.create(os.path.join(member_dir, "wal"), encode_metadata(local.id, cid))
    try:
        w.save_snapshot(raftpb.WalSnapshot(index, term, pb_conf))
        w.save(raftpb.HardState(term=term, vote=0, commit=index), [], must_sync=True)
    finally:
        w.close()
    os.makedirs(data_dir, exist_ok=True)
    os.rename(member_dir, os.path.join(data_dir, "member"))
    shutil.rmtree(tmp, ignore_errors=True)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return RestoredMember(data_dir, local.id, cid, index)
