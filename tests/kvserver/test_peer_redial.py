"""A restarted peer is dialled again as soon as it dials us, not after the rest of a backoff.

The stream to a peer that is down is retried with exponential backoff (up to
``backoff_max_s``); a member that takes seconds to load its snapshot comes back in the middle
of a wait. Its own stream to us says it is back: ours to it is dialled at once.
"""

import socket

from aiohttp import web

from kvserver.localcluster.launcher import free_ports
from kvserver.rafthttp.transport import PeerTransport, TransportLimits
from tests.support.peer_port import serve_peer_port
from tests.support.wait import async_wait_for

CLUSTER = 0xC1
A, B = 0xA, 0xB
# A backoff far longer than the test may take: only the redial can connect in time.
LONG_BACKOFF = TransportLimits(backoff_min_s=60.0, backoff_max_s=60.0)


def _transport(local_id: int) -> PeerTransport:
    return PeerTransport(
        local_id=local_id,
        cluster_id=CLUSTER,
        on_messages=lambda msgs: None,
        on_unreachable=lambda peer: None,
        on_snapshot_status=lambda peer, ok: None,
        limits=LONG_BACKOFF,
    )


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_a_peer_that_dials_us_is_dialled_back_at_once():
    port_a, port_b = free_ports(2)
    a, b = _transport(A), _transport(B)
    runners: list[web.AppRunner] = []
    try:
        await a.start()
        runners.append(await serve_peer_port(a, port_a))
        assert _refused(port_b)
        a.add_peer(B, f"http://127.0.0.1:{port_b}")
        # A's first dial fails (nothing listens): its next try is a minute away.
        await async_wait_for(lambda: a._peers[B].failed_dials > 0, 10.0, "A's first dial to B")
        assert not a.is_connected(B)

        await b.start()
        runners.append(await serve_peer_port(b, port_b))
        b.add_peer(A, f"http://127.0.0.1:{port_a}")
        await async_wait_for(lambda: b.is_connected(A), 10.0, "B's stream to A")
        await async_wait_for(lambda: a.is_connected(B), 10.0, "A's stream to B, redialled")
    finally:
        await a.stop()
        await b.stop()
        for r in runners:
            await r.cleanup()
