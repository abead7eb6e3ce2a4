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

import pytest

from kvserver.client import Client
from tests.archive.helpers import (
    cli,
    pitr_under_load,
    restored_cluster,
    snapshot_restore_args,
    state_at,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


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
        snapshot_restore_args(path),
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
