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
from tests.etcdsnap.helpers import ROOT, observe, populate
from tests.support.etcdctl import Etcdctl

pytestmark = [pytest.mark.slow, pytest.mark.external]


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
