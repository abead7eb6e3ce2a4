"""``raftkv cluster up``'s members do not outlive it.

A supervisor killed outright (SIGKILL: no handler runs, nothing is stopped in order) must not
leave its members running and holding their ports: each member gets a parent-death signal
from the kernel. The test runs the real command on free ports, waits (bounded poll) until
every member answers /health, SIGKILLs the supervisor and waits (bounded) for every member
pid to be gone and every port to be free again.
"""

import os
import signal
import socket
import subprocess
from urllib.parse import urlsplit

import pytest

from tests.cluster.cluster_up import ClusterUp, gone
from tests.support.wait import wait_for

EXIT_S = 30.0


def _port_free(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the members bind
        try:
            s.bind((parts.hostname, parts.port))
        except OSError:
            return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_members_exit_when_the_supervisor_is_sigkilled(tmp_path):
    up = ClusterUp(str(tmp_path / "cluster"))
    pids = [n["pid"] for n in up.nodes.values()]
    urls = [u for n in up.nodes.values() for u in (n["url"], n["peer"])]
    try:
        up.wait_healthy()
        assert not any(gone(p) for p in pids), up.output()
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait(timeout=EXIT_S)
        wait_for(
            lambda: all(gone(p) for p in pids),
            EXIT_S,
            f"every member ({pids}) to exit after its supervisor was SIGKILLed",
            interval_s=0.1,
        )
        wait_for(lambda: all(_port_free(u) for u in urls), EXIT_S, f"ports of {urls} free")
    finally:
        for pid in pids:
            if not gone(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if up.proc.poll() is None:
            up.proc.kill()
            try:
                up.proc.wait(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                pass
