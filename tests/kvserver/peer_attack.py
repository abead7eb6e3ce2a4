"""An attacker of the peer port: forged raft frames sent over ``/raft/stream``.

``attack_url`` opens a stream to a member's peer URL claiming to be ``sender`` and sends the
messages in one frame; it tells whether the member refused the stream, closed it after the
frame, or kept it open. ``forged_payload`` is an entry's data framed as the node driver frames
a proposal (a put of ``FORGED_KEY``); ``STRANGER`` is an id no member has.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp

from kvserver.kvpb.kv import PutRequest
from kvserver.mvcc.codec import encode_entry
from kvserver.rafthttp.codec import encode_batch
from raft import Message

# Written out, not imported from the transport: the attacker speaks the wire, not our code.
CLUSTER_HEADER, FROM_HEADER, TO_HEADER = "X-Raftkv-Cluster-Id", "X-Raftkv-From", "X-Raftkv-To"
STRANGER = 0x5EC0_DEAD_BEEF  # not a member id
FORGED_KEY = b"forged"


def forged_payload() -> bytes:
    """An entry's data as the node driver frames it: origin | sequence | request."""
    return os.urandom(8) + (1).to_bytes(8, "big") + encode_entry(PutRequest(FORGED_KEY, b"x"))


async def attack_url(
    peer_url: str, cluster_id: int, sender: int, to: int, messages: list[Message]
) -> str:
    """Open a stream to ``peer_url`` as ``sender`` and send ``messages`` in one frame.
    Returns ``refused <status>``, ``closed`` (the member closed the stream after the frame)
    or ``open`` (it took the frame and kept the stream)."""
    headers = {CLUSTER_HEADER: str(cluster_id), FROM_HEADER: str(sender), TO_HEADER: str(to)}
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(peer_url + "/raft/stream", headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            return f"refused {exc.status}"
        async with ws:
            await ws.send_bytes(encode_batch(messages))
            try:
                async with asyncio.timeout(3.0):
                    frame = await ws.receive()
            except TimeoutError:
                return "open"
            return (
                "closed"
                if frame.type
                in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
                else "open"
            )
