"""Old snapshot files and WAL segments are deleted by a thread of their own
(kvserver.server.node_storage): the WAL writer, whose fsyncs every acknowledged write waits
for, never waits for an unlink (70 ms for a 270 MiB file on the test machine's file system).
"""

from __future__ import annotations

import asyncio
import threading

from kvserver.server.config import ServerConfig
from kvserver.server.node_storage import NodeStorage
from raft import ConfState, Entry, EntryType, HardState, Ready, SnapshotMetadata

WAIT_S = 10.0


class _BlockedPurge:
    """Stands in for the snapshotter's purge: records the thread it ran on, then waits."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self, keep: int) -> list[str]:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(WAIT_S)
        return []


async def test_a_slow_purge_does_not_hold_up_the_wal(tmp_path):
    cfg = ServerConfig(name="n1", data_dir=str(tmp_path / "n1"))
    storage, _fresh = await NodeStorage.open(cfg, member_id=1, cluster_id=7)
    purge = _BlockedPurge()
    storage.snapshotter.purge = purge  # type: ignore[method-assign]
    try:
        entries = tuple(
            Entry(term=1, index=i, type=EntryType.NORMAL, data=b"x" * 64) for i in (1, 2)
        )
        await storage.persist(
            Ready(hard_state=HardState(term=1, vote=1, commit=2), entries=entries, must_sync=True)
        )
        metadata = SnapshotMetadata(conf_state=ConfState(voters=(1,)), index=2, term=1)
        await asyncio.to_thread(storage.write_snapshot_file_in_child, metadata, [b"image"])
        data = await storage.record_snapshot_file(metadata)
        assert bytes(data) == b"image"
        assert await asyncio.to_thread(purge.entered.wait, WAIT_S)
        # the purge is still running: a write and its fsync go through meanwhile
        more = (Entry(term=1, index=3, type=EntryType.NORMAL, data=b"y" * 64),)
        await asyncio.wait_for(
            storage.persist(Ready(entries=more, must_sync=True)), timeout=WAIT_S / 2
        )
        assert not purge.release.is_set()
        assert purge.threads and purge.threads[0].startswith("purge")
    finally:
        purge.release.set()
        await asyncio.to_thread(storage.close)
