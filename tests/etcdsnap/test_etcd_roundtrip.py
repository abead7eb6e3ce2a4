"""etcd -> raftkv -> etcd through snapshot files, with Debian's etcd 3.4 and etcdctl.

1. A real etcd gets keys with history (overwrites, deletes, a transaction writing two keys
   in one revision), a compaction, a lease with keys attached, a role with permissions,
   users, and auth enabled.
2. ``etcdctl snapshot save`` -> ``raftkv snapshot restore`` -> ``raftkv serve``: raftkv,
   asked by etcdctl, serves the same keys with the same create/mod revisions and versions
   (``get -w json``), the same history at every revision down to the compact revision
   (and refuses the one below it as etcd does), the same lease (TTL, keys), users and
   roles; alice logs in with her etcd password (her bcrypt hash moved with her).
3. ``etcdctl snapshot save`` against raftkv -> ``etcdctl snapshot status`` reads it (the
   revision) -> ``etcdctl snapshot restore`` -> etcd starts from it and serves the same
   again, alice's password included.

Slow (three servers in turn); external (etcd, etcdctl).
"""

from __future__ import annotations

import pytest

from tests.archive.helpers import restored_cluster, snapshot_restore_args
from tests.etcd_process import etcd_process
from tests.support.etcdctl import Etcdctl

pytestmark = [pytest.mark.slow, pytest.mark.external]

ROOT = ("--user", "root:rootpw")


def populate(ctl: Etcdctl) -> int:
    """The etcd state of the test; returns the compact revision."""
    for i in range(3):
        ctl.run("put", "a", f"v{i}")
    for i in range(40):
        ctl.run("put", f"dir/{i:02d}", "x" * (i * 50))
    compact = int(ctl.json("get", "a")["header"]["revision"]) - 20
    ctl.run("compact", str(compact))
    ctl.run("del", "dir/05")
    ctl.run("txn", stdin="\nput t1 one\nput t2 two\n\n\n")
    lease = ctl.run("lease", "grant", "600").split()[1]
    ctl.run("put", "leased/1", "l1", f"--lease={lease}")
    ctl.run("put", "leased/2", "l2", f"--lease={lease}")
    ctl.run("put", "a", "after")
    ctl.run("del", "dir/1", "--prefix")
    ctl.run("role", "add", "r1")
    ctl.run("role", "grant-permission", "r1", "readwrite", "dir/", "dir0")
    ctl.run("user", "add", "root:rootpw")
    ctl.run("user", "grant-role", "root", "root")
    ctl.run("user", "add", "alice:alicepw")
    ctl.run("user", "grant-role", "alice", "r1")
    ctl.run("auth", "enable")
    return compact


def kvs(answer: dict) -> list:
    return [
        (
            kv["key"],
            kv.get("value"),
            kv["create_revision"],
            kv["mod_revision"],
            kv.get("version"),
            kv.get("lease"),
        )
        for kv in answer.get("kvs", [])
    ]


def observe(ctl: Etcdctl, compact: int) -> dict:
    """What etcdctl sees of the state: every comparison of the test is on this."""
    now = ctl.json(*ROOT, "get", "", "--prefix")
    revision = int(now["header"]["revision"])
    history = {
        rev: kvs(ctl.json(*ROOT, "get", "", "--prefix", f"--rev={rev}"))
        for rev in range(compact, revision + 1)
    }
    below = ctl.call(*ROOT, "get", "a", f"--rev={compact - 1}")
    leases = [f"{x['id']:x}" for x in ctl.json(*ROOT, "lease", "list").get("leases", [])]
    ttls = {}
    for lease in leases:
        t = ctl.json(*ROOT, "lease", "timetolive", lease, "--keys")
        ttls[lease] = (t["granted-ttl"], sorted(t.get("keys") or []))
    return {
        "revision": revision,
        "kvs": kvs(now),
        "history": history,
        "below_compact": "required revision has been compacted" in below.stderr,
        "leases": ttls,
        "users": ctl.run(*ROOT, "user", "list").split(),
        "alice": ctl.run(*ROOT, "user", "get", "alice"),
        "r1": ctl.run(*ROOT, "role", "get", "r1"),
        "alice_reads": ctl.run("--user", "alice:alicepw", "get", "dir/00"),
        "alice_wrong_password": ctl.call("--user", "alice:nope", "get", "dir/00").returncode,
    }


def test_etcd_to_raftkv_and_back_by_snapshot(tmp_path):
    for d in ("etcd1", "etcd2"):
        (tmp_path / d).mkdir()
    with etcd_process(str(tmp_path / "etcd1")) as etcd:
        ctl = Etcdctl([etcd.url], "--command-timeout=30s")
        compact = populate(ctl)
        original = observe(ctl, compact)
        saved = str(tmp_path / "etcd.db")
        ctl.run(*ROOT, "snapshot", "save", saved)
    assert original["below_compact"] and original["leases"] and original["alice_wrong_password"]
    assert len(original["history"]) > 25

    cluster = restored_cluster(tmp_path / "raftkv", snapshot_restore_args(saved), size=1)
    try:
        rk = Etcdctl(cluster.endpoints, "--command-timeout=30s")
        assert observe(rk, compact) == original
        back = str(tmp_path / "raftkv.db")
        rk.run(*ROOT, "snapshot", "save", back)
    finally:
        cluster.stop()
    status = Etcdctl([]).json("snapshot", "status", back)
    assert status["revision"] == original["revision"] and status["totalKey"] > 50

    with etcd_process(str(tmp_path / "etcd2"), restore_from=back) as etcd2:
        again = Etcdctl([etcd2.url], "--command-timeout=30s")
        assert observe(again, compact) == original
        # the restored etcd goes on from the same revision
        again.run(*ROOT, "put", "new", "1")
        assert again.json(*ROOT, "get", "new")["kvs"][0]["mod_revision"] == original["revision"] + 1
