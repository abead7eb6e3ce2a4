"""Pending ReadIndex requests on the leader (SAFE mode, etcd's readOnly).

A request records the commit index at the time it arrived and is broadcast in a heartbeat
round carrying its context. When a quorum acknowledges that round, the leader knows it was
still leader after the request arrived, so the recorded index is a linearizable read point.
Because a later round also proves leadership for every earlier request, one quorum ack
releases the acknowledged request *and all requests queued before it* — that is the
batching: many pending reads confirmed by one round.

Bounded by the caller: contexts are unique (a duplicate context is ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raft.config import ReadOnlyOption
from raft.types import Message


@dataclass(slots=True)
class ReadIndexStatus:
    req: Message  # the MsgReadIndex (its frm says whom to answer)
    index: int  # the leader's commit index when the request arrived
    acks: set[int] = field(default_factory=set)


class ReadOnly:
    def __init__(self, option: ReadOnlyOption) -> None:
        self.option = option
        self.pending: dict[bytes, ReadIndexStatus] = {}
        self.queue: list[bytes] = []  # invariant: same keys as pending, in arrival order

    def add_request(self, index: int, m: Message) -> None:
        ctx = m.entries[0].data
        if ctx in self.pending:
            return
        self.pending[ctx] = ReadIndexStatus(req=m, index=index)
        self.queue.append(ctx)

    def recv_ack(self, node_id: int, ctx: bytes) -> set[int] | None:
        """Record that ``node_id`` acknowledged the round for ``ctx``; return the ackers."""
        rs = self.pending.get(ctx)
        if rs is None:
            return None
        rs.acks.add(node_id)
        return rs.acks

    def advance(self, ctx: bytes) -> list[ReadIndexStatus]:
        """Dequeue the request ``ctx`` and every request queued before it."""
        if ctx not in self.pending:
            return []
        i = self.queue.index(ctx)
        done, self.queue = self.queue[: i + 1], self.queue[i + 1 :]
        return [self.pending.pop(c) for c in done]

    def last_pending_request_ctx(self) -> bytes:
        return self.queue[-1] if self.queue else b""
