"""Shared pieces of the archive tests: CLI runs, restored clusters, history snapshots, the
keys of a restored data dir read offline, and point-in-time restores checked against the
history of a cluster archiving under load while its leader is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request

import raftpb
import snap
import wal
from kvserver.archive.archiver import Archiver, wal_tail
from kvserver.client import Client
from kvserver.kvpb.kv import RangeRequest
from kvserver.lease.snapshot import split_snapshot
from kvserver.localcluster.launcher import LocalCluster, free_ports
from kvserver.membership.identity import encode_metadata
from kvserver.membership.registry import split_members_frame
from kvserver.mvcc.store import MVCCStore
from tests.cluster.harness import leader_of, wait_healthy
from tests.support.wait import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(*args: str, env: dict | None = None, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvserver.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )


def state_at(client: Client, revision: int = 0) -> dict[bytes, tuple]:
    """Every key's (value, create, mod, version) at ``revision`` (0 = now)."""
    res = client.range(b"\0", b"\0", revision=revision)  # from \0: every key
    return {kv.key: (kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in res.kvs}


def restored_cluster(tmp, restore_args, size: int = 3, token: str = "restored") -> LocalCluster:
    """A new LocalCluster whose nodes' data dirs are built by ``restore_args(name, data_dir,
    initial_cluster, peer_url)`` (a CLI argument list), then started."""
    c = LocalCluster(
        str(tmp),
        size=size,
        token=token,
        extra_args=["--heartbeat-interval", "50", "--election-timeout", "500"],
    )
    initial = ",".join(f"{n.name}={n.peer_url}" for n in c.nodes)
    for n in c.nodes:
        r = cli(
            *restore_args(n.name, n.data_dir, initial, n.peer_url), "--initial-cluster-token", token
        )
        assert r.returncode == 0, r.stderr
    c.start()
    wait_healthy(c, timeout_s=60)
    return c


def snapshot_restore_args(path):
    """``restore_args`` for ``restored_cluster``: every node restored from the snapshot file
    ``path`` with ``raftkv snapshot restore``."""
    return lambda name, d, initial, peer: (
        "snapshot",
        "restore",
        path,
        "--data-dir",
        d,
        "--name",
        name,
        "--initial-cluster",
        initial,
        "--initial-advertise-peer-urls",
        peer,
    )


__all__ = ["cli", "free_ports", "restored_cluster", "snapshot_restore_args", "state_at"]


def _load(client: Client, stop: threading.Event, counter: list[int]) -> None:
    i = 0
    while not stop.is_set() and i < 100_000:
        try:
            client.put(f"load/{i % 200:04d}", f"v{i}")
            if i % 17 == 0:
                client.delete(f"load/{(i * 7) % 200:04d}")
            counter[0] += 1
        except Exception:  # a leader change: the next put goes elsewhere
            pass
        i += 1


def pitr_under_load(
    make_cluster, tmp_path, archive_url: str, env: dict | None = None, options: tuple[str, ...] = ()
):
    """Archive under load, SIGKILL + restart the leader, PITR to several revisions."""
    serve_opts = ("--archive-options", ",".join(options)) if options else ()
    c = make_cluster(
        3,
        extra_args=[
            "--archive-url",
            archive_url,
            "--archive-interval",
            "200",
            "--snapshot-count",
            "400",
            *serve_opts,
        ],
    )
    cl = Client(c.endpoints)
    stop, counter = threading.Event(), [0]
    loader = threading.Thread(target=_load, args=(Client(c.endpoints), stop, counter))
    loader.start()
    try:
        wait_for(lambda: counter[0] >= 600, 120, "600 writes")
        leader = leader_of(c)
        c.kill(leader, signal.SIGKILL)
        wait_for(
            lambda: leader_of(c, [n for n in c.nodes if n is not leader]) is not None,
            30,
            "a new leader",
        )
        wait_for(lambda: counter[0] >= 1200, 120, "600 more writes")
        c.start_node(leader)
        wait_healthy(c, timeout_s=60)
        wait_for(lambda: counter[0] >= 1600, 120, "400 more writes")
    finally:
        stop.set()
        loader.join(60)
    last = cl.put("final", "x").header.revision
    targets = sorted({5, last // 4, last // 2, (3 * last) // 4, last})
    history = {t: state_at(cl, t) for t in targets}
    # the archive catches up within a few passes (each member archives its own log)
    wait_for(
        lambda: "raftkv_archive_lag_entries 0.0" in _metrics(c.endpoints[0]),
        60,
        "archive caught up",
    )
    c.stop()
    for t in targets:
        data_dir = str(tmp_path / f"pitr-{t}")
        r = cli(
            "restore",
            "--from",
            archive_url,
            "--to-revision",
            str(t),
            "--data-dir",
            data_dir,
            "--name",
            "solo",
            "--initial-cluster",
            "solo=http://127.0.0.1:1",
            *[a for o in options for a in ("--archive-option", o)],
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert f"restored revision {t} " in r.stdout
        history_t = history[t]
        restored = read_data_dir(data_dir)
        assert restored == history_t, f"revision {t}"
    return c


def _metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def read_data_dir(data_dir: str) -> dict:
    """The keys of a restored data dir, read offline from its snapshot."""
    pb = snap.Snapshotter(os.path.join(data_dir, "member", "snap")).load()
    _, rest = split_members_frame(pb.data)
    _, mvcc = split_snapshot(rest)
    store = MVCCStore.restore([bytes(mvcc)])
    out = {}
    res = store.apply(RangeRequest(b"\0", b"\0")).response
    for kv in res.kvs:
        out[kv.key] = (kv.value, kv.create_revision, kv.mod_revision, kv.version)
    return out


def live_member(tmp_path):
    """(data dir, its WAL open for appends as a running member's is, 64 KiB segments, and a
    ``snap.Snapshotter`` on its snap dir), for archiver tests without a member."""
    data_dir = tmp_path / "m"
    (data_dir / "member" / "snap").mkdir(parents=True)
    w = wal.create(
        str(data_dir / "member" / "wal"), encode_metadata(0xA, 0xC), segment_size_bytes=64 * 1024
    )
    return str(data_dir), w, snap.Snapshotter(str(data_dir / "member" / "snap"))


def append_entries(w, first: int, last: int, data: bytes = b"x" * 300) -> None:
    """Committed entries ``first``..``last``, one write each."""
    for i in range(first, last + 1):
        w.save(raftpb.HardState(1, 0, i), [raftpb.Entry(1, i, 0, data)])


def live_archiver(store, data_dir: str, w, **kw) -> Archiver:
    """An archiver of ``live_member``'s data dir, wired to its open WAL as ``raftkv serve``
    wires it."""
    return Archiver(
        store,
        data_dir,
        cluster_id=0xC,
        member_id=0xA,
        tail=lambda: wal_tail(w),
        last_index=lambda: w.last_index,
        **kw,
    )
