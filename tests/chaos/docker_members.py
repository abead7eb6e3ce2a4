"""The chaos suite's members as the three containers of deploy/docker-compose.yml.

Contract
--------
:func:`compose_members` is a context manager: it brings the compose cluster up through
``deploy/up.sh up`` (tests/deploy/compose.py: unique project name, free host ports, offline
base image when no registry answers) and yields a :class:`DockerCluster`; on exit the
members' logs are saved and the project is taken down with ``down -v`` (containers, network,
named volumes), whatever happened. :func:`leftovers` lists what of a project is still there.

:class:`DockerCluster` is a :class:`~tests.chaos.members.ChaosCluster` (same ``members``,
``endpoints``, ``leader()``, ``wait_healthy()``, ``status()``), so the runner's workloads,
checks and report and the :class:`~tests.chaos.nemesis.Nemesis` work unchanged. Clients reach
each member on its published client port (127.0.0.1, through Docker's port forwarding). The
faults are Docker's:

- ``kill``: ``docker kill -s KILL`` (the restart policy does not restart a killed container:
  Docker counts ``kill`` as a manual stop), wait until it is not running; ``start_member``:
  ``docker start``.
- ``pause``/``resume``: ``docker pause``/``unpause`` (the cgroup freezer: every process of the
  container stops, as SIGSTOP does).
- :class:`DockerNetwork` (the nemesis' ``net``): ``isolate(i)`` is ``docker network
  disconnect`` of member ``i`` from the compose network, ``heal()`` is ``docker network
  connect`` with the member's aliases again (the peers find it by its service name). A
  disconnected container has no network but loopback: unlike the namespace partitions, the
  test's clients lose it too. Cutting a single pair (``partition-bridge``) is not possible
  this way: :meth:`DockerNetwork.partition` refuses it.

"No member exited unless the nemesis killed it": :meth:`DockerCluster.exited` names a
container that is not running although the nemesis did not kill it, or whose start time
changed since we last started it (the restart policy restarted a crashed member).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from tests.chaos.members import ChaosCluster, Member
from tests.deploy import compose as dc

# ``docker network disconnect`` takes a member off the whole network: no single-pair cut.
UNSUPPORTED_FAULTS = {
    "partition-bridge": "cutting one pair only is not possible with `docker network disconnect`"
}


@dataclass
class DockerMember(Member):
    service: str = ""
    container: str = ""
    dead: bool = False  # killed by the nemesis, not started again yet
    started_at: str = ""  # State.StartedAt after our last start

    def alive(self) -> bool:
        return not self.dead


class DockerNetwork:
    """Partitions by disconnecting a member from the compose network (see module doc)."""

    def __init__(self, cluster: DockerCluster, name: str, aliases: dict[int, list[str]]):
        self.cluster = cluster
        self.name = name
        self.aliases = aliases
        self.disconnected: set[int] = set()

    def isolate(self, index: int) -> None:
        m = self.cluster.members[index]
        self.cluster.docker("network", "disconnect", self.name, m.container)
        self.disconnected.add(index)

    def partition(self, cuts) -> None:
        cuts = [set(c) for c in cuts]
        raise ValueError(
            f"cannot cut only {cuts}: `docker network disconnect` removes a "
            "member from the whole network (use isolate)"
        )

    def heal(self) -> None:
        for index in sorted(self.disconnected):
            m = self.cluster.members[index]
            args = ["network", "connect"]
            for alias in self.aliases.get(index, []):
                args += ["--alias", alias]
            self.cluster.docker(*args, self.name, m.container)
            self.disconnected.discard(index)


class DockerCluster(ChaosCluster):
    # ChaosCluster.__init__ builds process command lines: not called on purpose.
    def __init__(self, compose: dc.ComposeCluster, log_dir: str):
        self.compose = compose
        self.data_dir = log_dir
        self.net = None
        os.makedirs(log_dir, exist_ok=True)
        self.members = []
        network_names: set[str] = set()
        aliases: dict[int, list[str]] = {}
        for i, service in enumerate(dc.SERVICES):
            url = urlsplit(compose.urls[service])
            cid = compose.containers[service]
            info = json.loads(self.docker("inspect", cid).stdout)[0]
            networks = info["NetworkSettings"]["Networks"]
            network_names.update(networks)
            (net_info,) = networks.values()
            # the short container id alias comes back by itself; the service name must be
            # given again, the peers address each other by it
            aliases[i] = [a for a in (net_info.get("Aliases") or []) if not cid.startswith(a)]
            self.members.append(
                DockerMember(
                    i,
                    service,
                    url.hostname,
                    url.port,
                    2380,
                    "",
                    os.path.join(log_dir, f"{service}.log"),
                    [],
                    service=service,
                    container=info["Id"],  # the full id: _states() is keyed by it
                    started_at=info["State"]["StartedAt"],
                )
            )
        (network_name,) = network_names
        self.network = DockerNetwork(self, network_name, aliases)

    def docker(self, *args: str, timeout_s: float = 60):
        return dc.run([self.compose.docker, *args], timeout_s=timeout_s)

    def _states(self) -> dict[str, dict]:
        proc = dc.run(
            [self.compose.docker, "inspect", *(m.container for m in self.members)], timeout_s=60
        )
        return {c["Id"]: c["State"] for c in json.loads(proc.stdout)}

    # -- the faults -------------------------------------------------------------------------

    def start(self) -> None:
        dead = [m for m in self.members if m.dead]
        if dead:  # one command: a full-cluster restart brings everyone back together
            self.docker("start", *(m.container for m in dead))
            self._after_start(dead)

    def start_member(self, m: Member) -> None:
        if m.dead:
            self.docker("start", m.container)
            self._after_start([m])

    def _after_start(self, members) -> None:
        states = self._states()
        for m in members:
            m.dead = False
            m.paused = False
            m.started_at = states[m.container]["StartedAt"]

    def kill(self, m: Member) -> float | None:
        """SIGKILL; returns when the container died (time.monotonic(), from the daemon's
        ``FinishedAt``, bounded by the command's start and end): the nemesis measures from
        there, not from the start of a ``docker kill`` that takes a few hundred ms."""
        if m.dead:
            return None
        before = time.monotonic()
        dc.run([self.compose.docker, "kill", "-s", "KILL", m.container], check=False)
        deadline = time.monotonic() + 30
        while (state := self._states()[m.container])["Running"]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{m.name} still running 30 s after docker kill")
            time.sleep(0.05)
        m.dead = True
        m.paused = False
        now_mono, now_wall = time.monotonic(), time.time()
        died = now_mono - (now_wall - _wall_clock(state["FinishedAt"]))
        return min(max(died, before), now_mono)

    def pause(self, m: Member) -> float | None:
        """``docker pause``; returns when the command returned (the freezer is in place)."""
        if m.dead or m.paused:
            return None
        dc.pause(self.compose.docker, m.container)
        m.paused = True
        return time.monotonic()

    def resume(self, m: Member) -> None:
        if m.paused:
            self.docker("unpause", m.container)
        m.paused = False

    def stop(self, timeout_s: float = 15.0) -> None:
        """Heal what is left and save each member's log; ``down -v`` does the rest."""
        with contextlib.suppress(AssertionError):
            self.network.heal()
        for m in self.members:
            with contextlib.suppress(AssertionError):
                self.resume(m)
            proc = dc.run([self.compose.docker, "logs", "-t", m.container], check=False)
            with open(m.log_path, "w") as f:
                f.write(proc.stdout + proc.stderr)

    def log_tail(self, m: Member, lines: int = 40) -> str:
        proc = dc.run([self.compose.docker, "logs", "--tail", str(lines), m.container], check=False)
        return proc.stdout + proc.stderr

    def exit_reason(self, m: Member) -> str:
        state = self._states()[m.container]
        return (
            f"status {state['Status']}, exit code {state['ExitCode']}, started at "
            f"{state['StartedAt']} (we started it at {m.started_at})"
        )

    def exited(self) -> list[Member]:
        states = self._states()
        return [
            m
            for m in self.members
            if not m.dead
            and (
                not states[m.container]["Running"]
                or states[m.container]["StartedAt"] != m.started_at
            )
        ]


def _wall_clock(rfc3339: str) -> float:
    """``2026-11-25T00:03:12.123456789Z`` (Docker's nanoseconds) -> seconds since the epoch."""
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    frac = "".join(c for c in frac if c.isdigit())
    stamp = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return stamp + (int(frac[:6].ljust(6, "0")) / 1e6 if frac else 0.0)


def leftovers(docker: str, project: str) -> list[str]:
    """Containers, networks and volumes still labelled with the compose ``project``."""
    label = f"label=com.docker.compose.project={project}"
    found = []
    for kind, cmd in (
        ("container", ["ps", "-a", "-q"]),
        ("network", ["network", "ls", "-q"]),
        ("volume", ["volume", "ls", "-q"]),
    ):
        proc = dc.run([docker, *cmd, "--filter", label], check=False)
        found += [f"{kind} {x}" for x in proc.stdout.split()]
    return found


@contextlib.contextmanager
def compose_members(log_dir: str):
    """The compose cluster as a :class:`DockerCluster` (skips/fails like tests/deploy when
    Docker or a base image is missing); ``down -v`` at the end. The cluster's ``project`` is
    in ``cluster.compose.project`` for :func:`leftovers`."""
    docker = dc.docker_command()
    dc.remove_stale_projects(docker)
    with dc.compose_cluster(docker, dc.APP_IMAGE, dc.base_image_env(docker)) as (compose, _):
        cluster = DockerCluster(compose, log_dir)
        try:
            yield cluster
        finally:
            cluster.stop()
