"""A snapshot continued from the previous one (no fork: the previous file's body copied, the
changes since appended) is a snapshot like any other: a member restarts from it with exactly
its keys, values and revisions; a compaction makes the next snapshot whole again, after
which they continue; ``raftkv_snapshots_made_total`` says how each was made."""

import asyncio
import re
import urllib.request

import pytest

from kvserver.assembly.member import Member
from kvserver.kvpb.errors import CompactedError
from kvserver.kvpb.kv import CompactionRequest, PutRequest, RangeRequest
from kvserver.server.node_storage import NodeStorage
from snap import forked
from tests.support.inprocess import configs, start_all, stop_all, wait_leader
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.skipif(not forked.available(), reason="needs fork and pidfd")


def _cfgs(tmp_path, **overrides):
    # Every member snapshots every 40 entries or so and keeps its whole log: a follower
    # that falls behind on a loaded machine then catches up from the log, never by the
    # leader's snapshot, so each member's snapshots are its own to count.
    return configs(
        tmp_path,
        snapshot_count=40,
        snapshot_catchup_entries=100_000,
        snapshot_catchup_bytes=0,
        **overrides,
    )


async def _put(members, keys: range, tag: str) -> None:
    for i in keys:  # ten keys, written over and over: the history outgrows the keys
        await members[i % 3].node.sm.put(
            PutRequest(b"c%02d" % (i % 10), b"%s%d" % (tag.encode(), i))
        )


async def _put_until(members, done, what: str, start: int, tag: str) -> int:
    """Put batches of ten until ``done()`` (a snapshot starts only after an apply, so a
    condition on snapshots needs writes that go on); the next key number."""
    deadline = asyncio.get_running_loop().time() + 60
    while not done():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"still no {what} after 60 s of puts")
        await _put(members, range(start, start + 10), tag)
        start += 10
    return start


async def _view(member, revision: int = 0) -> list[tuple]:
    got = await member.node.sm.range(RangeRequest(b"c", b"d", revision=revision))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in got.kvs]


async def _restart(members, cfgs, i: int) -> Member:
    await members[i].stop()
    members[i] = Member(cfgs[i])
    await members[i].start()
    await async_wait_for(lambda: members[i].node.recovered.is_set(), 30, "replay done")
    return members[i]


async def test_a_member_restarts_from_a_continued_snapshot_with_its_history(tmp_path):
    cfgs = _cfgs(tmp_path)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        await _put(members, range(300), "v")
        victim = members[2]
        made = victim.node.snapshots_made
        # the first snapshot forks; the ones after it continue
        await _put_until(members, lambda: made["continued"] >= 2, "continued snapshots", 300, "x")
        assert made["child"] >= 1 and made["loop"] == 0
        # a continued snapshot's layout is known from making it: only whole ones are read
        # back (the next continuation then starts from the layout it adopted)
        assert victim.node.snapshot_layout_reads <= made["child"]
        await async_wait_for(lambda: victim.node._snapshot_task is None, 60, "snapshot kept")
        index = victim.node.snapshot_index
        expected = {rev: await _view(members[0], rev) for rev in (0, 150, 290)}
        restarted = await _restart(members, cfgs, 2)
        assert restarted.node.snapshot_index >= index  # it started from a continued one
        for rev, rows in expected.items():
            assert await _view(restarted, rev) == rows
        assert len(expected[0]) == 10 and expected[0] != expected[290]
        # the layout of the snapshot it started from is found at start: no fork after it
        await async_wait_for(
            lambda: restarted.node._snapshot_layout is not None, 30, "the layout found"
        )
        made = restarted.node.snapshots_made
        await _put_until(members, lambda: made["continued"] >= 1, "continued snapshot", 0, "w")
        assert made["child"] == 0
    finally:
        await stop_all(members)


async def test_a_compaction_makes_the_next_snapshot_whole_then_they_continue(tmp_path):
    cfgs = _cfgs(tmp_path)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        await _put(members, range(150), "a")
        made = [m.node.snapshots_made for m in members]
        after = await _put_until(
            members, lambda: all(m["continued"] >= 1 for m in made), "continued", 150, "a"
        )
        compact_at = members[0].node.sm.store.revision - 20
        await members[0].node.sm.compact(CompactionRequest(compact_at))
        children = [m["child"] for m in made]
        after = await _put_until(
            members,
            lambda: all(m["child"] > c for m, c in zip(made, children, strict=True)),
            "whole snapshot on every member after the compaction",
            after,
            "b",
        )
        # one snapshot at a time: what is continued from now on comes after the whole one
        continued = [m["continued"] for m in made]
        await _put_until(
            members,
            lambda: all(m["continued"] > c for m, c in zip(made, continued, strict=True)),
            "continued snapshot again",
            after,
            "c",
        )
        expected = await _view(members[0])
        restarted = await _restart(members, cfgs, 1)
        assert await _view(restarted) == expected
        with pytest.raises(CompactedError):
            await _view(restarted, compact_at - 1)

        url = restarted.cfg.listen_client_urls[0] + "/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        series = dict(
            re.findall(r'^raftkv_snapshots_made_total\{how="(\w+)"\} (\S+)$', text.decode(), re.M)
        )
        assert set(series) == {"continued", "child", "loop"}
    finally:
        await stop_all(members)


async def test_with_continuation_off_every_snapshot_forks(tmp_path):
    cfgs = _cfgs(tmp_path, snapshot_incremental=False)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        made = members[0].node.snapshots_made
        await _put_until(members, lambda: made["child"] >= 2, "snapshots", 0, "v")
        assert made["continued"] == 0
    finally:
        await stop_all(members)


async def test_a_failed_writer_leaves_the_member_up_and_snapshots_whole(tmp_path, monkeypatch):
    original = NodeStorage.continue_snapshot_file

    def out_of_range(self, metadata, source, source_range, parts, head_bytes):
        # a range past the source's data: the writer process refuses it and exits 3
        return original(self, metadata, source, (0, 1 << 40), parts, head_bytes)

    monkeypatch.setattr(NodeStorage, "continue_snapshot_file", out_of_range)
    cfgs = _cfgs(tmp_path)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        made = members[0].node.snapshots_made
        await _put_until(members, lambda: made["child"] >= 2, "whole snapshots", 0, "v")
        assert made["continued"] == 0
        assert members[0].node._snapshot_incremental is False  # tried, failed, turned off
        assert not members[0].node.failed.is_set()
        assert len(await _view(members[0])) == 10
    finally:
        await stop_all(members)
