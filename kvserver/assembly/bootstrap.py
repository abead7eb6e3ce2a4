"""Bootstrap one member: everything that exists before any part of it runs.

``bootstrap(cfg, peer_ssl)``, in order:

1. resolve the member's identity: from its WAL on a restart (the flags are not consulted, as
   etcd), from the running cluster for ``--initial-cluster-state existing``, else derived from
   ``--initial-cluster``;
2. open ``<data-dir>/member`` (WAL + snapshots; a torn WAL tail is repaired once, any other
   corruption stops the start with the file, the offset and the repair command);
3. restore the member registry from the newest snapshot and build the raft core from what was
   recovered; a brand-new member of a new cluster bootstraps the initial configuration.

It returns ``Bootstrapped``: the recovered parts, nothing started and no socket open. The
state machine's image stays in ``snapshot`` for ``Member.start`` to restore into the KV state
machine it builds around the node (committed entries after the snapshot are re-applied by the
node's Ready loop).
"""

import logging
import random
from dataclasses import dataclass

from kvserver.membership.discovery import resolve_identity
from kvserver.membership.identity import cluster_id as derive_cluster_id
from kvserver.membership.registry import MemberRegistry, split_members_frame
from kvserver.server.config import ServerConfig
from kvserver.server.node_storage import NodeStorage
from raft import Config, RawNode
from raft.types import ConfState, Snapshot


@dataclass(frozen=True)
class Bootstrapped:
    member_id: int
    cluster_id: int
    registry: MemberRegistry  # restored from the snapshot, if there is one
    storage: NodeStorage
    raw: RawNode
    snapshot: Snapshot | None  # the newest snapshot (its image holds the state machine's)
    applied: int  # the snapshot's index: entries up to it are in the image
    conf_state: ConfState


async def bootstrap(cfg: ServerConfig, *, peer_ssl=None) -> Bootstrapped:
    local = cfg.local_member()
    member_id, cluster_id, known = await resolve_identity(
        cfg, local.id, derive_cluster_id([m.id for m in cfg.members]), peer_ssl=peer_ssl
    )
    registry = MemberRegistry(known)
    storage, fresh = await NodeStorage.open(cfg, member_id=member_id, cluster_id=cluster_id)
    newest = storage.raft_storage.snapshot()
    snapshot = None if newest.is_empty() else newest
    applied = 0
    if snapshot is not None:
        blob, _ = split_members_frame(snapshot.data)
        registry.restore(blob, snapshot.metadata.conf_state)
        applied = snapshot.metadata.index
    raw = RawNode(raft_config(cfg, member_id, storage, applied))
    if fresh and cfg.initial_cluster_state == "new":
        raw.bootstrap(sorted(m.id for m in cfg.members))
    _, conf_state = storage.raft_storage.initial_state()
    return Bootstrapped(
        member_id, cluster_id, registry, storage, raw, snapshot, applied, conf_state
    )


def raft_config(cfg: ServerConfig, member_id: int, storage: NodeStorage, applied: int) -> Config:
    """The raft core's settings for a member (etcd's defaults where it has them)."""
    return Config(
        id=member_id,
        storage=storage.raft_storage,
        election_tick=cfg.election_ticks,
        heartbeat_tick=1,
        applied=applied,
        check_quorum=True,
        pre_vote=cfg.pre_vote,
        max_size_per_msg_bytes=1 << 20,
        max_inflight_msgs=512,
        max_uncommitted_entries_size_bytes=1 << 30,
        # Election jitter from the OS, not seeded by the member id: a cluster must not repeat
        # the same timings (or the same split vote) on every run. Only the simulator seeds
        # raft's randomness.
        rng=random.SystemRandom(),
        # Role changes, campaigns and refused votes, at INFO (as etcd logs them): an operator
        # reading a member's log sees each election.
        logger=logging.getLogger("raft"),
    )
