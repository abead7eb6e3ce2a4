"""The history recorder: outcomes, misuse, threads, asyncio, and end-to-end checks."""

from __future__ import annotations

import asyncio
import itertools
import pickle
import threading

import pytest

from tests.lincheck import (
    INFINITY,
    History,
    HistoryError,
    KvModel,
    Verdict,
    assert_linearizable,
    check,
    kv,
    merge_operations,
)


def fake_clock():
    ticks = itertools.count(10)
    return lambda: next(ticks)


def test_ok_info_fail_and_unfinished() -> None:
    h = History(clock=fake_clock())
    a = h.invoke("c1", kv.put("x", "a"))  # t=10
    b = h.invoke("c2", kv.get("x"))  # t=11
    c = h.invoke("c3", kv.put("x", "z"))  # t=12
    d = h.invoke("c4", kv.put("x", "d"))  # t=13, never completed
    h.ok(a, kv.put_ok())  # t=14
    h.info(b)
    h.fail(c)
    ops = h.operations()
    assert [(o.op_id, o.client_id, o.call, o.ret) for o in ops] == [
        (0, "c1", 10, 14),
        (1, "c2", 11, INFINITY),
        (3, "c4", 13, INFINITY),
    ]
    assert ops[1].pending and ops[2].pending and not ops[0].pending
    assert ops[1].output is None
    assert h.failed_count == 1
    assert len(h) == 3
    del d


def test_misuse_is_a_typed_error() -> None:
    h = History(clock=fake_clock(), max_operations=2)
    a = h.invoke(0, kv.get("x"))
    h.ok(a, kv.get_ok(None))
    with pytest.raises(HistoryError, match="already completed"):
        h.ok(a, kv.get_ok(None))
    with pytest.raises(HistoryError, match="already completed"):
        h.info(a)
    b = h.invoke(0, kv.get("x"))
    with pytest.raises(HistoryError, match="needs an output"):
        h.ok(b, None)
    with pytest.raises(HistoryError, match="more than 2"):
        h.invoke(0, kv.get("x"))


def test_operation_validates_times_and_outputs() -> None:
    from tests.lincheck import Operation

    with pytest.raises(ValueError, match="before call"):
        Operation(0, 0, 5, 4, kv.get("x"), kv.get_ok(None))
    with pytest.raises(ValueError, match="no output"):
        Operation(0, 0, 5, INFINITY, kv.get("x"), kv.get_ok(None))
    with pytest.raises(ValueError, match="needs an output"):
        Operation(0, 0, 5, 6, kv.get("x"), None)


def test_record_context_manager_defaults_to_unknown_outcome() -> None:
    h = History(clock=fake_clock())
    with h.record(0, kv.put("x", "a")) as r:
        r.ok(kv.put_ok())
    with pytest.raises(TimeoutError):
        with h.record(0, kv.put("x", "b")):
            raise TimeoutError
    with h.record(0, kv.put("x", "c")) as r:
        r.fail()
    ops = h.operations()
    assert [o.pending for o in ops] == [False, True]
    assert h.failed_count == 1


class LockedStore:
    """A linearizable store: every operation happens atomically under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, tuple[str, int]] = {}
        self._revision = 0

    def put(self, key: str, value: str) -> int:
        with self._lock:
            self._revision += 1
            self._data[key] = (value, self._revision)
            return self._revision

    def get(self, key: str) -> tuple[str, int] | None:
        with self._lock:
            return self._data.get(key)


def test_threads_recording_a_linearizable_store_check_ok() -> None:
    history = History()
    store = LockedStore()

    def client(cid: int) -> None:
        for n in range(150):
            key = f"k{(cid + n) % 3}"
            if n % 3 == 0:
                value = f"{cid}-{n}"
                with history.record(cid, kv.put(key, value)) as r:
                    r.ok(kv.put_ok(store.put(key, value)))
            else:
                with history.record(cid, kv.get(key)) as r:
                    found = store.get(key)
                    r.ok(kv.get_ok(*(found or (None, None))))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops = history.operations()
    assert len(ops) == 8 * 150 and not any(op.pending for op in ops)
    result = assert_linearizable(KvModel(), history)
    assert len(result.partitions) == 3


class ReadCacheStore(LockedStore):
    """A broken store: reads are served from a cache refreshed only every 100 reads."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[str, tuple[str, int]] = {}
        self._reads = 0

    def get(self, key: str) -> tuple[str, int] | None:
        with self._lock:
            if self._reads % 100 == 0:
                self._cache = dict(self._data)
            self._reads += 1
            return self._cache.get(key)


def test_stale_cache_is_caught_end_to_end() -> None:
    history = History()
    store = ReadCacheStore()
    with history.record(0, kv.get("x")) as r:  # fills the (empty) cache
        r.ok(kv.get_ok(*(store.get("x") or (None, None))))
    with history.record(0, kv.put("x", "a")) as r:
        r.ok(kv.put_ok(store.put("x", "a")))
    with history.record(1, kv.get("x")) as r:  # served from the stale cache
        r.ok(kv.get_ok(*(store.get("x") or (None, None))))
    result = check(KvModel(), history)
    assert result.verdict is Verdict.ILLEGAL
    assert "get('x') -> absent" in result.explanation
    with pytest.raises(AssertionError, match="NOT LINEARIZABLE"):
        assert_linearizable(KvModel(), history)


async def test_asyncio_tasks_record_into_one_history() -> None:
    history = History()
    data: dict[str, str] = {}
    late_writes: list[asyncio.Task] = []

    async def correct_client(cid: int) -> None:
        for n in range(50):
            key = f"k{n % 2}"
            if n % 2:
                with history.record(cid, kv.put(key, f"{cid}-{n}")) as r:
                    await asyncio.sleep(0)
                    data[key] = f"{cid}-{n}"
                    await asyncio.sleep(0)
                    r.ok(kv.put_ok())
            else:
                with history.record(cid, kv.get(key)) as r:
                    await asyncio.sleep(0)
                    value = data.get(key)
                    await asyncio.sleep(0)
                    r.ok(kv.get_ok(value))

    await asyncio.gather(*(correct_client(c) for c in range(6)))
    assert len(history.operations()) == 300
    assert check(KvModel(), history).ok

    # a broken async store that acknowledges a write before applying it
    broken = History()

    async def apply_later(key: str, value: str) -> None:
        await asyncio.sleep(0.001)
        data[key] = value

    with broken.record(0, kv.put("z", "acked")) as r:
        late_writes.append(asyncio.create_task(apply_later("z", "acked")))
        r.ok(kv.put_ok())
    with broken.record(1, kv.get("z")) as r:
        r.ok(kv.get_ok(data.get("z")))
    await asyncio.gather(*late_writes)
    assert check(KvModel(), broken).verdict is Verdict.ILLEGAL


def test_histories_from_several_recorders_merge_and_pickle() -> None:
    clock = fake_clock()
    h1, h2 = History(clock=clock), History(clock=clock)
    a = h1.invoke("p1", kv.put("x", "a"))
    h1.ok(a, kv.put_ok())
    b = h2.invoke("p2", kv.get("x"))
    h2.ok(b, kv.get_ok("a"))
    shipped = pickle.loads(pickle.dumps(h2.operations()))  # as from another process
    merged = merge_operations(h1.operations(), shipped)
    assert [op.op_id for op in merged] == [0, 1]
    assert [op.client_id for op in merged] == ["p1", "p2"]
    assert check(KvModel(), merged).ok
