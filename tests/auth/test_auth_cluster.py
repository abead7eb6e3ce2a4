"""Auth with real ``raftkv serve`` processes (slow): set up through one member with the CLI,
enforced identically on every member (each answering from its own replicated state), kept by
a follower that catches up from the leader's snapshot, by a full restart from snapshots, by
``snapshot save``/``restore`` into a new cluster, and by point-in-time restore over a log
with auth entries."""

from __future__ import annotations

import glob
import os
import signal

import pytest

import snap
from kvserver.cli import main
from kvserver.client import Client, ClientError
from kvserver.membership.registry import split_members_frame
from tests.archive.helpers import cli, restored_cluster, snapshot_restore_args
from tests.cluster.harness import SNAPSHOT_OFTEN_ARGS, leader_of, wait_healthy
from tests.support.apply_now import raftkv_without_raft
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

ROOT = dict(user="root", password="rootpw")
ALICE = dict(user="alice", password="alicepw")
OPTS = dict(timeout_s=20.0, attempt_timeout_s=3.0)


def setup_auth(endpoint: str) -> None:
    """root, role app = readwrite on prefix a/, alice with app, auth enabled: via the CLI."""
    root = ("--user", "root:rootpw")
    for argv in (
        ["user", "add", "root:rootpw"],
        ["user", "grant-role", "root", "root"],
        ["role", "add", "app"],
        ["role", "grant-permission", "app", "readwrite", "a/", "--prefix"],
        ["user", "add", "alice:alicepw"],
        ["user", "grant-role", "alice", "app"],
        ["auth", "enable"],
        ["auth", "status", *root],
    ):
        assert main([*argv, "--endpoints", endpoint, "--timeout", "20"]) == 0, argv


def check_enforced(endpoint: str, tag: str) -> None:
    """On this member alone: alice writes and reads under a/, nothing else; no token, no
    access. Serializable reads are answered from this member's own auth state."""
    with Client([endpoint], prefer_leader=False, **OPTS, **ALICE) as alice:
        alice.put(f"a/{tag}", tag)
        wait_for(
            lambda: alice.get(f"a/{tag}", serializable=True) is not None,
            20,
            f"a/{tag} applied on {endpoint}",
        )
        with pytest.raises(ClientError, match="permission denied"):
            alice.get("b/secret", serializable=True)
        with pytest.raises(ClientError, match="permission denied"):
            alice.put(f"b/{tag}", "x")
    with (
        Client([endpoint], prefer_leader=False, **OPTS) as anon,
        pytest.raises(ClientError, match="user name is empty"),
    ):
        anon.get("a/x", serializable=True)


def snap_files(node) -> list[str]:
    return glob.glob(os.path.join(node.data_dir, "member", "snap", "*.snap"))


def fill(endpoints: list[str], n: int, prefix: str) -> None:
    with Client(endpoints, **OPTS, **ROOT) as root:
        for i in range(n):
            root.put(f"{prefix}/{i % 20:02d}", str(i))


def test_auth_enforced_on_every_member_and_kept_by_snapshots(make_cluster):
    c = make_cluster(3, extra_args=SNAPSHOT_OFTEN_ARGS)
    setup_auth(c.endpoints[0])
    with Client(c.endpoints, **OPTS, **ROOT) as root:
        root.put("b/secret", "s")
    for i, ep in enumerate(c.endpoints):
        check_enforced(ep, f"m{i}")

    # A follower that falls behind the leader's log catches up from a snapshot with auth.
    leader = leader_of(c)
    follower = next(n for n in c.nodes if n is not leader)
    c.kill(follower, signal.SIGKILL)
    fill([n.client_url for n in c.nodes if n is not follower], 120, "fill")
    c.start_node(follower)
    wait_healthy(c, timeout_s=60)
    wait_for(
        lambda: "restored snapshot at index" in c.log_tail(follower, 400),
        60,
        f"{follower.name} restored the leader's snapshot",
    )
    check_enforced(follower.client_url, "caught-up")

    # Every member has taken snapshots; after a full restart auth state comes from them.
    fill(c.endpoints, 60, "more")
    wait_for(lambda: all(snap_files(n) for n in c.nodes), 30, "a snapshot on every member")
    c.stop()
    c.start()
    wait_healthy(c, timeout_s=60)
    for i, ep in enumerate(c.endpoints):
        check_enforced(ep, f"restart{i}")
    with Client(c.endpoints, **OPTS, **ROOT) as root:
        assert root.auth_request("status").get("enabled") is True
        assert root.auth_request("role/get", {"role": "app"})["perm"] == [
            {"permType": "READWRITE", "key": "YS8=", "range_end": "YTA="}
        ]


def test_snapshot_save_restore_keeps_auth(make_cluster, tmp_path):
    c = make_cluster(1)
    ep = c.endpoints[0]
    setup_auth(ep)
    with Client([ep], **OPTS, **ALICE) as alice:
        alice.put("a/1", "one")
    path = str(tmp_path / "auth.snap")
    r = cli("snapshot", "save", path, "--endpoints", ep)  # maintenance needs root
    assert r.returncode == 1 and "user name is empty" in r.stderr
    r = cli("snapshot", "save", path, "--endpoints", ep, "--user", "root:rootpw")
    assert r.returncode == 0, r.stderr
    c.stop()
    new = restored_cluster(
        tmp_path / "new",
        snapshot_restore_args(path),
        size=1,
    )
    try:
        check_enforced(new.endpoints[0], "restored")
        with Client(new.endpoints, **OPTS, **ALICE) as alice:
            assert alice.get("a/1").value == b"one"
        with Client(new.endpoints, **OPTS, **ROOT) as root:
            assert root.auth_request("user/list")["users"] == ["alice", "root"]
    finally:
        new.stop()


def test_point_in_time_restore_over_auth_entries(make_cluster, tmp_path):
    url = "file://" + str(tmp_path / "archive")
    c = make_cluster(
        1, extra_args=["--archive-url", url, "--archive-interval", "200", *SNAPSHOT_OFTEN_ARGS]
    )
    ep = c.endpoints[0]
    fill([ep], 50, "before")  # a snapshot without auth, then auth entries in the log
    setup_auth(ep)
    fill([ep], 60, "after")  # a snapshot with the auth frame, then more log
    with Client([ep], **OPTS, **ROOT) as root:
        root.auth_request("role/add", {"name": "late"})  # only in the log's tail
        last = root.put("final", "x").header.revision

    def lag_zero() -> bool:
        import urllib.request

        with urllib.request.urlopen(ep + "/metrics", timeout=5) as resp:
            return "raftkv_archive_lag_entries 0.0" in resp.read().decode()

    wait_for(lag_zero, 60, "archive caught up")
    c.stop()
    data_dir = str(tmp_path / "pitr")
    r = cli(
        "restore",
        "--from",
        url,
        "--latest",
        "--data-dir",
        data_dir,
        "--name",
        "solo",
        "--initial-cluster",
        "solo=http://127.0.0.1:1",
    )
    assert r.returncode == 0, r.stderr
    pb = snap.Snapshotter(os.path.join(data_dir, "member", "snap")).load()
    _, rest = split_members_frame(pb.data)
    kv = raftkv_without_raft(cluster_id=1, member_id=1, name="solo", members=())
    kv.restore(bytes(rest))
    assert kv.store.revision == last
    assert kv.auth.enabled and kv.auth.users() == ["alice", "root"]
    assert kv.auth.roles() == ["app", "late"]
    assert kv.auth.can_read("alice", b"a/1") and not kv.auth.can_read("alice", b"b")
