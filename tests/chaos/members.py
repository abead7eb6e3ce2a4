"""Three (or more) real ``raftkv serve`` processes for the chaos suite.

Contract
--------
:class:`ChaosCluster` starts each member as ``[ip netns exec NS] python -m kvserver.cli serve``
with its own data directory and log file under ``data_dir``. With a
:class:`~tests.chaos.netns.NetTopology`, member ``i`` listens on its namespace's address
(clients on port 2379, peers on 2380, as etcd's defaults) and the test reaches it over the
bridge; without one, members listen on free ports of 127.0.0.1 (no partitions possible).
Default raft timing (heartbeat 100 ms, election 1000 ms) unless ``extra_args`` says otherwise:
the failover figures are those of the default flags.

``ip netns exec`` execs the server, so ``proc.pid`` is the server's pid and signals reach it
directly. ``kill``/``pause``/``resume``/``start_member`` act on one member; ``stop`` resumes
and stops all (SIGTERM, then SIGKILL after a bounded wait). ``leader()`` is the member every
reachable member names as leader; ``wait_healthy`` polls (bounded) until every running member
answers ``/health`` 200 and they agree on one leader, and fails when :meth:`exited` names a
member (a subclass, tests/chaos/docker_members.py, runs the members as containers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from kvserver.localcluster.launcher import free_ports
from tests.chaos.netns import NetTopology
from tests.cluster.harness import get_json
from tests.support.procs import stop_processes


@dataclass
class Member:
    index: int
    name: str
    host: str
    client_port: int
    peer_port: int
    data_dir: str
    log_path: str
    args: list[str]
    proc: subprocess.Popen | None = None
    paused: bool = False
    member_id: int | None = None

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def running(self) -> bool:
        """Alive and not stopped by SIGSTOP."""
        return self.alive() and not self.paused


class ChaosCluster:
    def __init__(
        self,
        data_dir: str,
        size: int = 3,
        net: NetTopology | None = None,
        extra_args: list[str] | None = None,
        token: str = "raftkv-chaos",
    ):
        self.data_dir = data_dir
        self.net = net
        self.members: list[Member] = []
        # environment added to one member's process, by name (the soak's fault shims)
        self.member_env: dict[str, dict[str, str]] = {}
        os.makedirs(data_dir, exist_ok=True)
        if net is not None:
            assert net.size == size
            endpoints = [(net.addresses[i], 2379, 2380) for i in range(size)]
        else:
            ports = free_ports(2 * size)
            endpoints = [("127.0.0.1", ports[2 * i], ports[2 * i + 1]) for i in range(size)]
        for i, (host, cport, pport) in enumerate(endpoints):
            name = f"node{i + 1}"
            self.members.append(
                Member(
                    i,
                    name,
                    host,
                    cport,
                    pport,
                    os.path.join(data_dir, name),
                    os.path.join(data_dir, f"{name}.log"),
                    [],
                )
            )
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.args = [
                sys.executable,
                "-m",
                "kvserver.cli",
                "serve",
                "--name",
                m.name,
                "--data-dir",
                m.data_dir,
                "--listen-client-urls",
                m.client_url,
                "--advertise-client-urls",
                m.client_url,
                "--listen-peer-urls",
                m.peer_url,
                "--initial-advertise-peer-urls",
                m.peer_url,
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                token,
                *(extra_args or []),
            ]

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    # -- processes --------------------------------------------------------------------------

    def start(self) -> None:
        for m in self.members:
            self.start_member(m)

    def start_member(self, m: Member) -> None:
        if m.alive():
            return
        prefix = self.net.command_prefix(m.index) if self.net is not None else []
        with open(m.log_path, "ab") as log:
            log.write(f"---- chaos: starting {m.name} at {time.time():.3f}\n".encode())
            log.flush()
            m.proc = subprocess.Popen(
                [*prefix, *m.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **self.member_env.get(m.name, {})),
                start_new_session=True,
            )
        m.paused = False

    def kill(self, m: Member) -> None:
        if m.alive():
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=30)
        m.paused = False

    def pause(self, m: Member) -> None:
        if m.alive():
            m.proc.send_signal(signal.SIGSTOP)
            m.paused = True

    def resume(self, m: Member) -> None:
        if m.alive():
            m.proc.send_signal(signal.SIGCONT)
        m.paused = False

    def stop(self, timeout_s: float = 15.0) -> None:
        stop_processes((m.proc for m in self.members), timeout_s)
        for m in self.members:
            if m.proc is not None:
                m.paused = False

    def log_tail(self, m: Member, lines: int = 40) -> str:
        try:
            with open(m.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    # -- state ------------------------------------------------------------------------------

    def status(self, m: Member, timeout_s: float = 1.5) -> dict | None:
        if not m.running():
            return None
        try:
            code, body = get_json(m.client_url, "/v1/status", timeout_s=timeout_s)
        except Exception:  # noqa: BLE001 - unreachable, reset, bad body: no status
            return None
        if code != 200:
            return None
        m.member_id = body.get("id", m.member_id)
        return body

    def healthy(self, m: Member) -> bool:
        if not m.running():
            return False
        try:
            return get_json(m.client_url, "/health", timeout_s=1.5)[0] == 200
        except Exception:  # noqa: BLE001
            return False

    def leader(self, among: list[Member] | None = None) -> Member | None:
        """The member that every running member of ``among`` names as leader, if they agree."""
        members = [m for m in (among or self.members) if m.running()]
        named = set()
        for m in members:
            st = self.status(m)
            if st is None:
                return None
            named.add(st.get("leader"))
        if len(named) != 1:
            return None
        (lead,) = named
        return next((m for m in self.members if m.member_id == lead and lead), None)

    def wait_healthy(self, timeout_s: float = 60.0) -> Member:
        """Every member running, healthy, and one agreed leader; AssertionError on timeout
        (with the logs' tails) or when a member exited by itself."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for m in self.exited():
                raise AssertionError(
                    f"{m.name} exited ({self.exit_reason(m)}):\n{self.log_tail(m)}"
                )
            if all(self.healthy(m) for m in self.members):
                lead = self.leader()
                if lead is not None:
                    return lead
            time.sleep(0.1)
        tails = "\n".join(f"--- {m.name}\n{self.log_tail(m, 15)}" for m in self.members)
        raise AssertionError(f"no healthy cluster with one leader after {timeout_s}s\n{tails}")

    def exit_reason(self, m: Member) -> str:
        return f"code {m.proc.returncode}" if m.proc is not None else "unknown"

    def exited(self) -> list[Member]:
        """Members whose process ended (not by our kill: we restart those before asking)."""
        return [m for m in self.members if m.proc is not None and not m.alive()]
