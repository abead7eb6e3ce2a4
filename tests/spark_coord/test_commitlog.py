"""CommitLog against a real raftkv process: put-if-absent versions (Delta's commit protocol),
no gaps, a fence in the same txn, errors that say which compare failed, paged history."""

import json
import os
import time

import pytest

from kvserver.client import Op
from kvserver.spark import commitlog as commitlog_mod
from kvserver.spark.commitlog import (
    CommitConflictError,
    CommitGapError,
    CommitLog,
)
from kvserver.spark.fencing import FencedOutError
from kvserver.spark.lock import FencedLock


def test_versions_are_put_if_absent_and_contiguous(client):
    log = CommitLog(client, "contiguous")
    assert log.latest() is None and log.next_version() == 0
    with pytest.raises(CommitGapError, match="before version 0"):
        log.commit(1, b"skips 0")
    e0 = log.commit(0, {"files": ["a"]})
    assert e0.version == 0 and e0.json() == {"files": ["a"]}
    with pytest.raises(CommitConflictError) as info:
        log.commit(0, b"again")
    assert info.value.existing == log.get(0) and info.value.existing.revision == e0.revision
    e1 = log.commit(1, "one")
    assert log.latest() == e1 and log.next_version() == 2
    assert [e.version for e in log.history()] == [0, 1]
    assert client.get(log.key(0)).version == 1  # the refused commit changed nothing


def test_also_ops_are_applied_atomically_with_the_commit(client):
    log = CommitLog(client, "also")
    log.commit(0, b"x", also=[Op.put("progress/also", "0")])
    assert client.get("progress/also").value == b"0"
    with pytest.raises(CommitConflictError):
        log.commit(0, b"y", also=[Op.put("progress/also", "refused")])
    assert client.get("progress/also").value == b"0"


def test_fenced_commit_says_which_compare_failed(client):
    lock = FencedLock(client, "which", ttl=5)
    fence = lock.acquire(timeout=10)
    log = CommitLog(client, "which")
    log.commit(0, b"a", fence=fence)
    with pytest.raises(CommitConflictError):
        log.commit(0, b"b", fence=fence)  # held lock, taken version: a conflict
    lock.release()
    with pytest.raises(FencedOutError, match="version 0 was meanwhile committed"):
        log.commit(0, b"b", fence=fence)  # lost lock and taken version: fenced out first
    with pytest.raises(FencedOutError, match="no longer exists"):
        log.commit(1, b"b", fence=fence)
    assert log.next_version() == 1


def test_each_commit_records_who_when_and_the_fence(client):
    lock = FencedLock(client, "records", ttl=5)
    fence = lock.acquire(timeout=10)
    log = CommitLog(client, "records", committer="job-7")
    before = time.time()
    log.commit(0, b"a", fence=fence)
    log.commit(1, b"b")
    with pytest.raises(CommitConflictError):
        log.commit(1, b"c", fence=fence)
    lock.release()
    first, second = log.info(0), log.info(1)
    assert first["committer"] == second["committer"] == "job-7"
    assert before - 1 <= first["committed_at"] <= second["committed_at"] <= time.time() + 1
    assert first["fence"] == {"key": fence.key.decode(), "token": fence.token}
    assert second["fence"] is None  # the refused commit left the record of version 1 alone
    assert log.info(2) is None
    # the records stay beside the versions: readers of versions do not see them
    assert [e.version for e in log.history()] == [0, 1] and log.latest().version == 1
    assert CommitLog(client, "other").committer.endswith(f":{os.getpid()}")


def test_history_pages_at_one_revision(client, monkeypatch):
    monkeypatch.setattr(commitlog_mod, "PAGE_SIZE", 3)
    log = CommitLog(client, "paged")
    for v in range(10):
        log.commit(v, json.dumps({"v": v}))
    got = log.history()
    first = [next(got) for _ in range(4)]
    log.commit(10, b"after the listing started")  # not in the listing's revision
    rest = list(got)
    assert [e.version for e in first + rest] == list(range(10))
    assert [e.version for e in log.history(3, 6)] == [3, 4, 5]
    assert [e.json()["v"] for e in log.history(8, 10)] == [8, 9]
    assert [e.version for e in log.history(9)] == [9, 10]


def test_bad_input(client):
    with pytest.raises(ValueError):
        CommitLog(client, "a/b")
    log = CommitLog(client, "bad")
    with pytest.raises(ValueError):
        log.commit(-1, b"x")
    with pytest.raises(TypeError):
        log.commit(0, b"x", fence="not a fence")
    with pytest.raises(TypeError):
        log.commit(0, 12)
    assert log.latest() is None
