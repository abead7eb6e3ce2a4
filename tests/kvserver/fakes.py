"""A node storage for driving ``kvserver.server.node.Node`` in one process: the raft log in a
``MemoryStorage``, persisted by keeping it there; snapshots kept in memory (no files, so the
node makes them on its loop: ``NodeOptions(snapshot_in_child=False)``)."""

from raft import MemoryStorage


class MemoryNodeStorage:
    def __init__(self) -> None:
        self.raft_storage = MemoryStorage()
        self.spill_dir = None

    async def persist(self, rd) -> None:
        if rd.hard_state is not None:
            self.raft_storage.set_hard_state(rd.hard_state)
        if rd.entries:
            self.raft_storage.append(rd.entries)

    async def save_snapshot(self, metadata, data_parts):
        return b"".join(data_parts)

    def compact(self, index: int) -> None:
        pass
