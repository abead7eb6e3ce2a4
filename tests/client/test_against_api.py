"""The client library against raftkv's own HTTP API (``kvserver.api.http.build_client_app``) over
``LocalKV`` (the MVCC store without raft, ``tests/api/fakes.py``).

This closes the loop client → etcd gateway dialect → service → MVCC store, and pins
request-id deduplication end to end: a write whose answer is lost to a client-side timeout
is retried with the same (client id, request id) and applied once — the revision increases by
one although the store saw the request twice.
"""

import asyncio

import pytest
from aiohttp import web

from kvserver.api.http import build_client_app
from kvserver.cli import client as cli_client
from kvserver.client import (
    AsyncClient,
    Client,
    Cmp,
    CompactedError,
    FutureRevisionError,
    InvalidArgumentError,
    NoLeaderError,
    Op,
    Txn,
)
from kvserver.kvpb.service_errors import no_leader
from kvserver.server.metrics import Metrics
from tests.api.fakes import LocalKV
from tests.client.fakeserver import FAST, LoopThread, _free_port


class SlowLocalKV(LocalKV):
    """LocalKV whose next ``slow_puts`` puts answer ``delay_s`` late (after applying), and that
    counts the puts that reached it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.slow_puts = 0
        self.delay_s = 0.0
        self.put_ids: list[tuple[int, int]] = []

    async def put(self, req, *, client_id=0, request_id=0):
        self.put_ids.append((client_id, request_id))
        response = await super().put(req, client_id=client_id, request_id=request_id)
        if self.slow_puts:
            self.slow_puts -= 1
            await asyncio.sleep(self.delay_s)
        return response


class Served:
    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv = SlowLocalKV(client_url=self.url)
        self.loop_thread = LoopThread()
        self.runner: web.AppRunner | None = None

    async def _start(self) -> None:
        app = build_client_app(self.kv, Metrics(process_metrics=False))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def start(self) -> "Served":
        self.loop_thread.run(self._start())
        return self

    def close(self) -> None:
        if self.runner is not None:
            self.loop_thread.run(self.runner.cleanup())
        self.loop_thread.close()


@pytest.fixture
def api():
    served = Served().start()
    yield served
    served.close()


def test_round_trip_through_the_real_api(api):
    with Client(api.url, **FAST) as c:
        p1 = c.put("jobs/1", "queued")
        assert p1.revision == 2 and p1.header.member_id == api.kv.member_id
        p2 = c.put("jobs/1", "running", prev_kv=True)
        assert p2.prev_kv.value == b"queued" and p2.revision == 3
        c.put("jobs/2", "queued")
        kv = c.get("jobs/1")
        assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"running", 2, 2, 3)
        r = c.range("jobs/", prefix=True, limit=1, sort_order="descend")
        assert [x.key for x in r.kvs] == [b"jobs/2"] and r.more and r.count == 2
        assert c.range("jobs/", prefix=True, count_only=True).count == 2
        assert c.get("jobs/1", revision=2).value == b"queued"
        t = c.txn(
            Txn()
            .when(Cmp.value("jobs/1") == "running")
            .then(Op.put("jobs/1", "done"), Op.get("jobs/1"))
        )
        assert t.succeeded and t.responses[1].kvs[0].value == b"done"
        d = c.delete("jobs/", prefix=True)
        assert d.deleted == 2
        c.compact(3)
        with pytest.raises(CompactedError):
            c.get("jobs/1", revision=2)
        with pytest.raises(FutureRevisionError):
            c.get("jobs/1", revision=1000)
        with pytest.raises(InvalidArgumentError):
            c.put("", "x")
        status = c.status()
        assert status.is_leader and status.revision == d.revision
        assert status.raft_applied_index == status.raft_index > 1
        # /v3/cluster/member/list is not served yet (501): the list comes from /v1/status.
        members = c.member_list()
        assert [(m.id, m.client_urls) for m in members] == [(api.kv.member_id, (api.url,))]
        assert c.find_leader() == api.url


def test_retried_write_after_timeout_is_applied_once(api):
    api.kv.slow_puts, api.kv.delay_s = 1, 0.6
    with Client(api.url, **dict(FAST, attempt_timeout_s=0.2)) as c:
        before = c.status().revision
        result = c.put("k", "v")
        after = c.status().revision
        assert c.get("k").version == 1
    assert len(api.kv.put_ids) == 2  # the store saw the write twice ...
    assert api.kv.put_ids[0] == api.kv.put_ids[1] == (c.client_id, api.kv.put_ids[0][1])
    assert after == before + 1  # ... and applied it once
    assert result.revision == after


async def test_same_request_id_from_the_same_client_id_is_deduplicated(api):
    """Two client objects sharing a client id (a restarted process reusing its id) send request
    id 1 each: the store answers the second with the first outcome."""
    async with (
        AsyncClient(api.url, client_id=42, **FAST) as a,
        AsyncClient(api.url, client_id=42, **FAST) as b,
    ):
        first = await a.put("k", "from a")
        second = await b.put("k", "from b")
        kv = await a.get("k")
    assert second.revision == first.revision
    assert kv.value == b"from a" and kv.version == 1


def test_no_leader_is_retried_then_reported(api):
    api.kv.fail_with = no_leader()
    with Client(api.url, retries=2, **FAST) as c, pytest.raises(NoLeaderError) as e:
        c.put("k", "v")
    assert len(e.value.attempts) == 3
    assert "etcdserver: no leader" in str(e.value)


def test_cli_status_against_the_real_api(api, capsys):
    assert cli_client.main(["status", f"--endpoints={api.url}"]) == 0
    out = capsys.readouterr().out
    row = [c.strip() for c in out.splitlines()[3].split("|")[1:-1]]
    assert row[:3] == [api.url, f"{api.kv.member_id:x}", "true"]
