"""A member reopens its storage from its newest snapshot, reading only the WAL from that
snapshot on; when the newest snapshot file is not one to start from (never recorded in the
WAL, past the WAL's commit, damaged), it reads every retained segment for the snapshots
they record, as etcd does, and starts from the newest of those (kvserver.server.node_storage).
"""

from __future__ import annotations

import asyncio
import logging
import os

from kvserver.server.config import ServerConfig
from kvserver.server.node_storage import NodeStorage
from raft import ConfState, Entry, EntryType, HardState, Ready, SnapshotMetadata

FALLBACK = "starting from the WAL's snapshot records"


def _config(tmp_path) -> ServerConfig:
    return ServerConfig(name="n1", data_dir=str(tmp_path / "n1"))


async def _open(cfg: ServerConfig) -> NodeStorage:
    storage, _fresh = await NodeStorage.open(cfg, member_id=1, cluster_id=7)
    return storage


async def _write(
    cfg: ServerConfig, entries: int, commit: int, recorded: list[int], unrecorded: int = 0
) -> None:
    """Entries 1..``entries`` (commit ``commit``), a snapshot file recorded in the WAL at each
    index of ``recorded``, and at ``unrecorded`` (if not 0) a newer file whose record never
    reached the WAL (a crash between the two)."""
    storage = await _open(cfg)
    try:
        log = tuple(
            Entry(term=1, index=i, type=EntryType.NORMAL, data=b"e%d" % i)
            for i in range(1, entries + 1)
        )
        await storage.persist(
            Ready(hard_state=HardState(term=1, vote=1, commit=commit), entries=log, must_sync=True)
        )
        for index in [*recorded, unrecorded]:
            if not index:
                continue
            metadata = SnapshotMetadata(conf_state=ConfState(voters=(1,)), index=index, term=1)
            image = [b"state at %d" % index]
            await asyncio.to_thread(storage.write_snapshot_file_in_child, metadata, image)
            if index != unrecorded:
                await storage.record_snapshot_file(metadata)
    finally:
        await asyncio.to_thread(storage.close)


async def _reopened(cfg: ServerConfig) -> tuple[int, bytes, list[int]]:
    """(snapshot index, snapshot data, indexes of the entries after it) after a reopen."""
    storage = await _open(cfg)
    try:
        rs = storage.raft_storage
        kept = rs.snapshot()
        after = [e.index for e in rs.entries(rs.first_index(), rs.last_index() + 1)]
        return kept.metadata.index, bytes(kept.data), after
    finally:
        await asyncio.to_thread(storage.close)


async def test_the_newest_recorded_snapshot_is_opened_without_the_fallback(tmp_path, caplog):
    cfg = _config(tmp_path)
    await _write(cfg, entries=30, commit=30, recorded=[10, 20])
    with caplog.at_level(logging.INFO, logger="kvserver.server.node_storage"):
        index, data, after = await _reopened(cfg)
    assert (index, data, after) == (20, b"state at 20", list(range(21, 31)))
    assert FALLBACK not in caplog.text


async def test_a_snapshot_file_never_recorded_in_the_wal_is_passed_over(tmp_path, caplog):
    cfg = _config(tmp_path)
    await _write(cfg, entries=30, commit=30, recorded=[10], unrecorded=25)
    with caplog.at_level(logging.INFO, logger="kvserver.server.node_storage"):
        index, data, after = await _reopened(cfg)
    assert (index, data, after) == (10, b"state at 10", list(range(11, 31)))
    assert FALLBACK in caplog.text


async def test_a_snapshot_past_the_commit_is_passed_over(tmp_path, caplog):
    cfg = _config(tmp_path)
    await _write(cfg, entries=30, commit=15, recorded=[10, 20])
    with caplog.at_level(logging.INFO, logger="kvserver.server.node_storage"):
        index, _data, after = await _reopened(cfg)
    assert index == 10 and after == list(range(11, 31))
    assert FALLBACK in caplog.text


async def test_a_damaged_newest_snapshot_is_set_aside_for_the_one_before(tmp_path, caplog):
    cfg = _config(tmp_path)
    await _write(cfg, entries=30, commit=30, recorded=[10, 20])
    newest = sorted(n for n in os.listdir(cfg.snap_dir) if n.endswith(".snap"))[-1]
    with open(os.path.join(cfg.snap_dir, newest), "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\xff\xff\xff")
    with caplog.at_level(logging.INFO, logger="kvserver.server.node_storage"):
        index, data, _after = await _reopened(cfg)
    assert (index, data) == (10, b"state at 10")
    assert FALLBACK in caplog.text
    assert any(n.endswith(".broken") for n in os.listdir(cfg.snap_dir))
