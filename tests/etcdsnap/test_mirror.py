"""``etcdctl make-mirror`` both ways between Debian's etcd 3.4 and raftkv: the live
migration path of docs/operations.md ("Migrating from etcd", "Back to etcd").

etcd -> raftkv: the keys present when the mirror starts are copied, then every put, delete
and multi-key transaction made on etcd while it runs shows up on raftkv. raftkv -> etcd:
the same the other way, with ``--prefix``/``--dest-prefix`` rewriting (etcdctl reads
raftkv's Range at a revision and its Watch from the next one). Compared on what a mirror
promises: every key's value (revisions are the destination's own).

Slow (two etcd processes and a raftkv member); external (etcd, etcdctl).
"""

from __future__ import annotations

import signal

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy
from tests.etcd_process import etcd_process
from tests.etcdsnap.helpers import contents
from tests.support.etcdctl import Etcdctl
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.external]

SYNC_S = 60.0


def stop(proc) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
    return out + err


def changes(ctl: Etcdctl, tag: str) -> None:
    ctl.run("put", "job/1", f"changed-{tag}")
    ctl.run("del", "job/2")
    ctl.run("txn", stdin=f"\nput job/t1 {tag}\nput job/t2 {tag}\n\n\n")
    for i in range(20):
        ctl.run("put", f"job/new{i:02d}", f"{tag}{i}")


def test_make_mirror_etcd_to_raftkv_and_back(tmp_path):
    (tmp_path / "etcd").mkdir()
    (tmp_path / "etcd2").mkdir()
    cluster = LocalCluster(str(tmp_path / "raftkv"), size=1)
    cluster.start()
    try:
        wait_healthy(cluster, timeout_s=60)
        rk = Etcdctl(cluster.endpoints)
        with etcd_process(str(tmp_path / "etcd")) as etcd:
            src = Etcdctl([etcd.url])
            for i in range(150):
                src.run("put", f"job/{i:03d}" if i > 2 else f"job/{i}", "v" * (i % 40))
            mirror = src.start("make-mirror", cluster.endpoints[0])
            try:
                wait_for(lambda: contents(rk) == contents(src), SYNC_S, "the base copied")
                changes(src, "etcd")
                wait_for(lambda: contents(rk) == contents(src), SYNC_S, "live changes copied")
            finally:
                out = stop(mirror)
            assert mirror.returncode is not None, out
            assert contents(rk)["job/1"] == "changed-etcd" and "job/2" not in contents(rk)

        with etcd_process(str(tmp_path / "etcd2")) as etcd2:
            dest = Etcdctl([etcd2.url])
            mirror = rk.start(
                "make-mirror", "--prefix", "job/", "--dest-prefix", "back/", etcd2.url
            )
            try:
                want = lambda: {"back/" + k[4:]: v for k, v in contents(rk, "job/").items()}  # noqa: E731
                wait_for(lambda: contents(dest, "back/") == want(), SYNC_S, "the base copied back")
                changes(rk, "raftkv")
                wait_for(
                    lambda: contents(dest, "back/") == want(), SYNC_S, "live changes copied back"
                )
            finally:
                stop(mirror)
            assert contents(dest, "back/")["back/1"] == "changed-raftkv"
    finally:
        cluster.stop()
