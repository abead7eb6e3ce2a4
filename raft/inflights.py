"""Flow control: the MsgApp messages in flight to one follower.

Each entry is (last index carried by the message, payload bytes). The window is full when it
holds ``max_count`` messages or at least ``max_bytes`` payload bytes; a message that takes the
byte total past the limit is still admitted (so a single large entry can always be sent).
Acknowledgements free everything at or below the acknowledged index.
"""

from __future__ import annotations

from collections import deque

from raft.errors import RaftInvariantError


class Inflights:
    __slots__ = ("max_count", "max_bytes", "_queue", "bytes")

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count  # invariant: count() <= max_count
        self.max_bytes = max_bytes
        self._queue: deque[tuple[int, int]] = deque()  # invariant: indexes increase
        self.bytes = 0  # invariant: == sum of the queued sizes

    def add(self, index: int, size_bytes: int) -> None:
        if self.full():
            raise RaftInvariantError("cannot add into a full inflights window")
        if self._queue and index <= self._queue[-1][0]:
            raise RaftInvariantError(f"inflight index {index} not above {self._queue[-1][0]}")
        self._queue.append((index, size_bytes))
        self.bytes += size_bytes

    def free_le(self, to: int) -> None:
        """Free the messages whose last index is <= ``to``."""
        q = self._queue
        while q and q[0][0] <= to:
            self.bytes -= q.popleft()[1]

    def free_first_one(self) -> None:
        """Free the oldest message (its acknowledgement may have been lost)."""
        if self._queue:
            self.bytes -= self._queue.popleft()[1]

    def full(self) -> bool:
        return len(self._queue) >= self.max_count or self.bytes >= self.max_bytes

    def count(self) -> int:
        return len(self._queue)

    def reset(self) -> None:
        self._queue.clear()
        self.bytes = 0
