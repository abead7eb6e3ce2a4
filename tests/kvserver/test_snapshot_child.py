"""A member's snapshots made by a forked child (snap.forked), or on its loop: either way
the member restarts from them with exactly its data; a child that fails leaves the member
running and its next snapshots are made on the loop."""

import asyncio
import re
import urllib.request

import pytest

from kvserver.assembly.member import Member
from kvserver.kvpb.kv import PutRequest, RangeRequest
from snap import forked
from snap.forked import ForkedChild
from tests.support.inprocess import configs, start_all, stop_all, wait_leader
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.skipif(not forked.available(), reason="needs fork and pidfd")


def _count_children(monkeypatch, work_wrapper=None) -> list[int]:
    started: list[int] = []
    original = ForkedChild.start.__func__

    def start(cls, work, *args, **kwargs):
        started.append(1)
        if work_wrapper is not None:
            work = work_wrapper(work)
        return original(cls, work, *args, **kwargs)

    monkeypatch.setattr(ForkedChild, "start", classmethod(start))
    return started


async def _write_and_restart(tmp_path, **overrides):
    cfgs = configs(
        tmp_path,
        snapshot_count=40,
        snapshot_catchup_entries=5,
        snapshot_catchup_bytes=0,
        **overrides,
    )
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        for i in range(150):
            await members[i % 3].node.sm.put(PutRequest(b"s%03d" % i, b"v%d" % i))
        victim = members[2]
        # a snapshot started during the puts (on the loop, after a failed child) may still
        # be in the making on a loaded machine
        await async_wait_for(lambda: victim.node.snapshot_index > 0, 30, "a snapshot taken")
        await victim.stop()
        members[2] = Member(cfgs[2])
        await members[2].start()
        got = await members[2].node.sm.range(RangeRequest(b"s", b"t"))
        return {kv.key: kv.value for kv in got.kvs}, members[2].node.snapshot_index
    finally:
        await stop_all(members)


@pytest.mark.parametrize("in_child", [True, False])
async def test_a_member_restarts_from_its_snapshots(tmp_path, monkeypatch, in_child):
    started = _count_children(monkeypatch)
    data, snapshot_index = await _write_and_restart(tmp_path, snapshot_in_child=in_child)
    assert data == {b"s%03d" % i: b"v%d" % i for i in range(150)}
    assert snapshot_index > 0
    assert (len(started) > 0) == in_child


async def test_a_failed_child_leaves_the_member_up_and_snapshots_move_to_the_loop(
    tmp_path, monkeypatch
):
    def broken(work):
        def failing():
            raise RuntimeError("injected: the snapshot child broke")

        return failing

    started = _count_children(monkeypatch, broken)
    data, snapshot_index = await _write_and_restart(tmp_path, snapshot_in_child=True)
    assert data == {b"s%03d" % i: b"v%d" % i for i in range(150)}
    assert snapshot_index > 0  # made on the loop after the failures
    # each member tried once, then stopped forking (the restarted member once more at most)
    assert 1 <= len(started) <= 4


async def test_a_child_failing_after_the_last_write_is_followed_by_a_snapshot_on_the_loop(
    tmp_path, monkeypatch
):
    """The next snapshot does not wait for the next write: on an idle member it would never
    come, and every restart would replay the whole log."""

    def broken_late(work):
        def failing():
            import time

            time.sleep(1.0)  # (in the child) the writes are all applied before it fails
            raise RuntimeError("injected: the snapshot child broke")

        return failing

    started = _count_children(monkeypatch, broken_late)
    cfgs = configs(tmp_path, snapshot_count=40, snapshot_in_child=True)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        for i in range(60):  # past the threshold of every member, then nothing more
            await members[0].node.sm.put(PutRequest(b"i%03d" % i, b"v"))
        await async_wait_for(
            lambda: all(m.node.snapshot_index > 0 for m in members), 30.0, "every member's snapshot"
        )
        assert started  # the children failed; these were made on the loop
    finally:
        await stop_all(members)


async def test_each_fork_is_timed_in_the_metrics(tmp_path):
    """A snapshot's fork holds the loop for as long as the page tables take to copy:
    ``raftkv_snapshot_fork_seconds`` counts one observation per child started."""
    cfgs = configs(tmp_path, snapshot_count=40, snapshot_catchup_entries=5)
    members = await start_all(cfgs)
    try:
        await wait_leader(members)
        for i in range(150):
            await members[i % 3].node.sm.put(PutRequest(b"f%03d" % i, b"v"))
        # snapshots are made in the background: wait for one
        await async_wait_for(
            lambda: any(m.node.snapshot_index > 0 for m in members), 30.0, "a snapshot"
        )
        member = next(m for m in members if m.node.snapshot_index > 0)
        buckets, total = member.node.snapshot_fork_seconds.snapshot()
        forks = buckets[-1][1]
        assert forks >= 1 and total > 0
        url = member.cfg.listen_client_urls[0] + "/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        scraped = re.search(r"^raftkv_snapshot_fork_seconds_count (\S+)$", text.decode(), re.M)
        assert scraped is not None and float(scraped.group(1)) >= forks  # (one more may start)
    finally:
        await stop_all(members)
