"""Three members in one event loop (no subprocesses): their configurations, starting and
stopping them, and the leader they agree on.

``configs`` gives three members on free loopback ports with fast ticks;
``configs_with_joiners`` gives a cluster plus members that join it later (``existing``
state), and ``retry_membership_change`` retries a membership call while the cluster is not
ready for it. ``agreed_leader`` is the member that leads with every given member following
it (None while an election is open or a member lags behind); ``wait_leader`` waits, bounded,
until there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from kvserver.assembly.member import Member
from kvserver.kvpb.service_errors import ServiceError
from kvserver.localcluster.launcher import free_ports
from kvserver.membership.identity import parse_initial_cluster
from kvserver.membership.reconfig import MSG_LEARNER_NOT_READY, MSG_UNHEALTHY
from kvserver.server.config import ServerConfig
from tests.support.wait import async_wait_for

T = TypeVar("T")
JOIN_TOKEN = "inproc-members"


def configs(tmp_path, prefix: str = "m", token: str = "inproc", **overrides) -> list[ServerConfig]:
    """Three members on free loopback ports with fast ticks (20 ms heartbeat, 200 ms
    election), data under ``tmp_path``; ``overrides`` are further ``ServerConfig`` fields."""
    ports = free_ports(6)
    initial = ",".join(f"{prefix}{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(3))
    members = tuple(parse_initial_cluster(initial, token))
    out = []
    for i in range(3):
        client = (f"http://127.0.0.1:{ports[2 * i]}",)
        peer = (f"http://127.0.0.1:{ports[2 * i + 1]}",)
        out.append(
            ServerConfig(
                name=f"{prefix}{i}",
                data_dir=str(tmp_path / f"{prefix}{i}"),
                listen_client_urls=client,
                advertise_client_urls=client,
                listen_peer_urls=peer,
                initial_advertise_peer_urls=peer,
                initial_cluster=initial,
                initial_cluster_token=token,
                heartbeat_interval_ms=20,
                election_timeout_ms=200,
                members=members,
                **overrides,
            )
        )
    return out


async def start_all(cfgs: list[ServerConfig]) -> list[Member]:
    """A started ``Member`` for every configuration, in order."""
    members = [Member(c) for c in cfgs]
    for m in members:
        await m.start()
    return members


async def stop_all(members: list[Member]) -> None:
    for m in members:
        await m.stop()


@contextlib.asynccontextmanager
async def running(cfgs: list[ServerConfig]) -> AsyncIterator[list[Member]]:
    """The members of ``cfgs``, started in order; all stopped at the end, in order (also
    those started before one that failed to start, and that one)."""
    members: list[Member] = []
    try:
        for cfg in cfgs:
            m = Member(cfg)
            members.append(m)
            await m.start()
        yield members
    finally:
        await stop_all(members)


def agreed_leader(members: list[Member]) -> Member | None:
    """The one member that leads, if every member of ``members`` knows it as leader."""
    leaders = [m for m in members if m.node.is_leader]
    if len(leaders) == 1 and all(m.node.leader == leaders[0].member_id for m in members):
        return leaders[0]
    return None


async def wait_leader(members: list[Member], timeout_s: float = 15.0) -> Member:
    """The agreed leader of ``members``, once there is one (fails after ``timeout_s``)."""
    return await async_wait_for(lambda: agreed_leader(members), timeout_s, "an agreed leader")


def configs_with_joiners(
    tmp_path, n: int = 3, joiners: int = 1, **overrides
) -> tuple[list[ServerConfig], list[ServerConfig]]:
    """``n`` members that form a new cluster, and ``joiners`` more that each join it (state
    ``existing``) once added: the k-th joiner's initial cluster is the first n + k + 1."""
    ports = free_ports(2 * (n + joiners))
    peers = [f"http://127.0.0.1:{ports[2 * i + 1]}" for i in range(n + joiners)]
    clients = [f"http://127.0.0.1:{ports[2 * i]}" for i in range(n + joiners)]

    def cfg(i, count, state):
        initial = ",".join(f"m{j}={peers[j]}" for j in range(count))
        return ServerConfig(
            name=f"m{i}",
            data_dir=str(tmp_path / f"m{i}"),
            listen_client_urls=(clients[i],),
            advertise_client_urls=(clients[i],),
            listen_peer_urls=(peers[i],),
            initial_advertise_peer_urls=(peers[i],),
            initial_cluster=initial,
            initial_cluster_token=JOIN_TOKEN,
            heartbeat_interval_ms=20,
            election_timeout_ms=200,
            initial_cluster_state=state,
            members=tuple(parse_initial_cluster(initial, JOIN_TOKEN)),
            **overrides,
        )

    return (
        [cfg(i, n, "new") for i in range(n)],
        [cfg(n + k, n + k + 1, "existing") for k in range(joiners)],
    )


async def retry_membership_change(call: Callable[[], Awaitable[T]], timeout_s: float = 15.0) -> T:
    """Retry a membership call while it fails with a retryable or readiness error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except ServiceError as exc:
            if loop.time() >= deadline or not (
                exc.retryable or exc.message in (MSG_LEARNER_NOT_READY, MSG_UNHEALTHY)
            ):
                raise
        await asyncio.sleep(0.05)
