"""``raftkv cluster up`` stops at once, naming the port, when a member's port is taken.

The check (``taken_ports``) is called directly on a cluster one of whose ports this test
holds with a listening socket: it names the port, the member, its role and this process as
the holder (found through /proc on Linux). The command itself, pointed at a held port, exits
non-zero before starting any member, with the same message.
"""

import os
import socket
import subprocess
import sys

import pytest

from kvserver.localcluster.launcher import LocalCluster
from kvserver.localcluster.ports import port_holder, port_is_free, taken_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_free_ports_report_no_conflict(tmp_path):
    cluster = LocalCluster(str(tmp_path / "c"), size=3)
    assert taken_ports(cluster.nodes) == []


def test_a_taken_peer_port_is_named_with_its_member_and_holder(tmp_path):
    cluster = LocalCluster(str(tmp_path / "c"), size=3)
    with listener() as held:
        port = held.getsockname()[1]
        cluster.nodes[1].peer_port = port
        conflicts = taken_ports(cluster.nodes)
        assert [(c.member, c.role, c.port) for c in conflicts] == [("node2", "peer", port)]
        text = conflicts[0].message()
        assert f"port {port} on 127.0.0.1 (node2's peer port) is already in use by" in text
        if sys.platform.startswith("linux"):
            assert f"pid {os.getpid()} (" in text, text
            assert "pytest" in text or "python" in text, text
    assert port_is_free("127.0.0.1", port)


def test_the_holder_of_a_port_nobody_holds_is_unknown():
    with listener() as s:
        port = s.getsockname()[1]
    assert port_holder(port) == "unknown"


def _held_base_port() -> socket.socket:
    """A listener on a port low enough that --base-port leaves room for the peer port."""
    for port in range(20000, 30000, 37):
        try:
            return listener(port)
        except OSError:
            continue
    pytest.skip("no free port in 20000..30000")


def test_cluster_up_on_a_taken_port_exits_at_once_naming_it(tmp_path):
    with _held_base_port() as held:
        port = held.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvserver.cli",
                "cluster",
                "up",
                "--nodes",
                "1",
                "--base-port",
                str(port),
                "--data-dir",
                str(tmp_path / "cluster"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"port {port} on 127.0.0.1 (node1's client port) is already in use by" in proc.stderr
    assert f"pid {os.getpid()} (" in proc.stderr or "unknown" in proc.stderr
    assert "nothing was started" in proc.stderr
    assert "starting" not in proc.stdout, proc.stdout
