"""Shared by the etcd interchange tests: an etcd state worth moving (``populate``), what
etcdctl sees of a state (``observe``: every comparison is on it), and every key's value
(``contents``: what a mirror promises)."""

from __future__ import annotations

import base64

from tests.support.etcdctl import Etcdctl

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


def contents(ctl: Etcdctl, prefix: str = "", *flags: str) -> dict[str, str]:
    answer = ctl.json(*flags, "get", prefix, "--prefix")  # "" with --prefix: every key
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
        for kv in answer.get("kvs", [])
    }
