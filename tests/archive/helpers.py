"""Shared pieces of the archive tests: CLI runs, restored clusters, history snapshots."""

from __future__ import annotations

import os
import subprocess
import sys

from kvserver.client import Client
from kvserver.localcluster.launcher import LocalCluster, free_ports
from tests.cluster.harness import wait_healthy

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


__all__ = ["cli", "free_ports", "restored_cluster", "state_at"]
