"""Backup and point-in-time restore with real ``raftkv serve`` processes (slow).

* etcdctl's contract for ``snapshot save`` -> ``snapshot restore``: a new three-member
  cluster started from the restored data dirs serves exactly the saved keys with their
  create/mod revisions and versions, under a new cluster ID.
* The continuous archive during a write load, with the leader SIGKILLed and restarted:
  point-in-time restore to several revisions equals the MVCC history read from the live
  cluster at those revisions (read before any compaction).
* A damaged or missing archive object is reported by name.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from kvserver.client import Client
from tests.archive.helpers import cli, restored_cluster, state_at
from tests.cluster.harness import leader_of, wait_healthy
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


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


def test_save_restore_new_three_node_cluster(make_cluster, tmp_path):
    c = make_cluster(3)
    cl = Client(c.endpoints)
    for i in range(300):
        cl.put(f"key/{i:03d}", f"value-{i}")
    for i in range(0, 300, 7):
        cl.delete(f"key/{i:03d}")
    cl.put("key/000", "again")
    saved = state_at(cl)
    revision = cl.range("key/000").revision
    old_cluster = cl.put("key/000", "again").header.cluster_id  # revision + 1 ...
    saved = state_at(cl)  # ... so read again
    revision += 1
    path = str(tmp_path / "backup.snap")
    r = cli("snapshot", "save", path, "--endpoints", c.endpoints[0])
    assert r.returncode == 0, r.stderr
    assert f"revision {revision}" in r.stdout
    st = cli("snapshot", "status", path, "--json")
    info = json.loads(st.stdout)
    assert (info["revision"], info["keys"]) == (revision, len(saved))
    c.stop()

    new = restored_cluster(
        tmp_path / "new",
        lambda name, d, initial, peer: (
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
        ),
    )
    try:
        for ep in new.endpoints:
            one = Client([ep])
            wait_for(lambda one=one: state_at(one) == saved, 20, f"{ep} serves the saved keys")
            assert one.range("key/000").revision == revision
            one.close()
        ncl = Client(new.endpoints)
        resp = ncl.put("after", "restore")
        assert resp.header.revision == revision + 1
        assert resp.header.cluster_id != old_cluster
    finally:
        new.stop()


def test_snapshot_with_bad_hash_is_refused(make_cluster, tmp_path):
    c = make_cluster(1)
    Client(c.endpoints).put("a", "b")
    path = str(tmp_path / "s.snap")
    assert cli("snapshot", "save", path, "--endpoints", c.endpoints[0]).returncode == 0
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))
    for args in (
        ("snapshot", "status", path),
        ("snapshot", "restore", path, "--data-dir", str(tmp_path / "d")),
    ):
        r = cli(*args)
        assert r.returncode == 1
        assert "hash mismatch" in r.stderr
    assert not os.path.exists(tmp_path / "d" / "member")


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
        restored = _read_data_dir(data_dir)
        assert restored == history_t, f"revision {t}"
    return c


def _metrics(url: str) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _read_data_dir(data_dir: str) -> dict:
    """The keys of a restored data dir, read offline from its snapshot."""
    import snap
    from kvserver.lease.snapshot import split_snapshot
    from kvserver.membership.registry import split_members_frame
    from kvserver.mvcc.store import MVCCStore

    pb = snap.Snapshotter(os.path.join(data_dir, "member", "snap")).load()
    _, rest = split_members_frame(pb.data)
    _, mvcc = split_snapshot(rest)
    store = MVCCStore.restore([bytes(mvcc)])
    out = {}
    from kvserver.kvpb.kv import RangeRequest

    res = store.apply(RangeRequest(b"\0", b"\0")).response
    for kv in res.kvs:
        out[kv.key] = (kv.value, kv.create_revision, kv.mod_revision, kv.version)
    return out


def test_pitr_after_leader_kill_equals_history(make_cluster, tmp_path):
    url = "file://" + str(tmp_path / "archive")
    pitr_under_load(make_cluster, tmp_path, url)
    # a damaged object and a missing one are reported by name
    parts = sorted(p for p in (tmp_path / "archive").rglob("*.wal.*"))
    victim = parts[len(parts) // 2]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = cli(
        "restore",
        "--from",
        url,
        "--latest",
        "--data-dir",
        str(tmp_path / "bad"),
        "--name",
        "solo",
        "--initial-cluster",
        "solo=http://127.0.0.1:1",
        "--member",
        victim.parent.parent.name,
    )
    assert r.returncode == 1
    assert victim.name in r.stderr and "corrupt" in r.stderr
    victim.unlink()
    r = cli(
        "restore",
        "--from",
        url,
        "--latest",
        "--data-dir",
        str(tmp_path / "bad2"),
        "--name",
        "solo",
        "--initial-cluster",
        "solo=http://127.0.0.1:1",
        "--member",
        victim.parent.parent.name,
    )
    assert r.returncode == 1
    assert victim.name in r.stderr and "missing" in r.stderr
