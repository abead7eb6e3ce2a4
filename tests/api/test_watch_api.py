"""``POST /v3/watch`` over ``LocalKV``: etcd 3.4's gateway shapes and the stream's lifetime.

Shapes were recorded from a real etcd 3.4.23 with the same requests, and
``test_watch_shapes_match_a_real_etcd`` (slow, external) sends one script of watches to a real
etcd and to a real one-member raftkv and compares every line; comments quote what etcd
answered. Semantics (replay, filters, compaction, bounds) are pinned in detail by
``tests/watch``; these tests check that the HTTP layer carries them and that a stream's
resources go away with its client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kvserver.kvpb.kv import CompactionRequest, DeleteRangeRequest, PutRequest
from kvserver.mvcc.store import MVCCStore
from kvserver.watch.hub import MSG_WATCHER_TOO_SLOW, WatchLimits
from tests.support.wait import async_wait_for

from .fakes import DEFAULT_CLUSTER_ID, DEFAULT_MEMBER_ID, LocalKV
from .helpers import Api, b64, serve

CID, MID = str(DEFAULT_CLUSTER_ID), str(DEFAULT_MEMBER_ID)
WAIT_S = 5.0


def hdr(revision: int | None) -> dict[str, str]:
    out = {"cluster_id": CID, "member_id": MID}
    if revision is not None:
        out["revision"] = str(revision)
    out["raft_term"] = "2"
    return out


def create(key: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key)}
    for name, value in fields.items():
        body[name] = b64(value) if name == "range_end" else value
    return {"create_request": body}


async def put(api: Api, key: str, value: str, **kw: Any) -> int:
    return (await api.service.put(PutRequest(key.encode(), value.encode(), **kw))).header.revision


class Stream:
    """One open watch request: its response lines as JSON, and (optionally) a request body
    the test keeps writing to."""

    def __init__(self, resp, queue: asyncio.Queue | None) -> None:
        self.resp = resp
        self.queue = queue

    async def line(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.resp.content.readline(), WAIT_S)
        assert raw.endswith(b"\n"), f"stream ended: {raw!r}"
        return json.loads(raw)

    async def result(self) -> dict[str, Any]:
        doc = await self.line()
        assert set(doc) == {"result"}, doc
        return doc["result"]

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.queue is not None
        await self.queue.put(json.dumps(obj).encode())

    async def end_body(self) -> None:
        assert self.queue is not None
        await self.queue.put(None)

    async def rest(self) -> bytes:
        """Everything until the end of the response (which must come)."""
        return await asyncio.wait_for(self.resp.content.read(), WAIT_S)

    def close(self) -> None:
        self.resp.close()


async def open_watch(
    api: Api,
    *objects: dict[str, Any],
    streaming: bool = False,
    raw: bytes | None = None,
    path: str = "/v3/watch",
) -> Stream:
    """POST the objects (one body), or stream them and keep the body open."""
    if not streaming:
        data = raw if raw is not None else b"".join(json.dumps(o).encode() for o in objects)
        resp = await api.client.post(path, data=data)
        return Stream(resp, None)
    queue: asyncio.Queue = asyncio.Queue()
    for o in objects:
        queue.put_nowait(json.dumps(o).encode())

    async def body():
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    resp = await api.client.post(path, data=body())
    return Stream(resp, queue)


# ---------------------------------------------------------------------------------------------
# Shapes


async def test_create_and_events_have_etcd_shapes() -> None:
    async with serve() as api:
        await put(api, "foo", "bar")  # rev 2
        s = await open_watch(api, create("foo", start_revision="1", prev_kv=True))
        assert s.resp.status == 200
        assert s.resp.headers["Content-Type"] == "application/json"
        assert s.resp.headers["Transfer-Encoding"] == "chunked"
        # etcd: {"result":{"header":{...,"revision":"2",...},"created":true}}
        assert await s.result() == {"header": hdr(2), "created": True}
        assert await s.result() == {
            "header": hdr(2),
            "events": [
                {
                    "kv": {
                        "key": b64("foo"),
                        "create_revision": "2",
                        "mod_revision": "2",
                        "version": "1",
                        "value": b64("bar"),
                    }
                }
            ],
        }
        await put(api, "foo", "baz")
        await api.service.delete_range(DeleteRangeRequest(b"foo"))
        assert await s.result() == {
            "header": hdr(3),
            "events": [
                {
                    "kv": {
                        "key": b64("foo"),
                        "create_revision": "2",
                        "mod_revision": "3",
                        "version": "2",
                        "value": b64("baz"),
                    },
                    "prev_kv": {
                        "key": b64("foo"),
                        "create_revision": "2",
                        "mod_revision": "2",
                        "version": "1",
                        "value": b64("bar"),
                    },
                }
            ],
        }
        # A deleted key's kv: only key and mod_revision; type DELETE (PUT is the default).
        assert await s.result() == {
            "header": hdr(4),
            "events": [
                {
                    "type": "DELETE",
                    "kv": {"key": b64("foo"), "mod_revision": "4"},
                    "prev_kv": {
                        "key": b64("foo"),
                        "create_revision": "2",
                        "mod_revision": "3",
                        "version": "2",
                        "value": b64("baz"),
                    },
                }
            ],
        }
        s.close()


async def test_exact_bytes_of_one_line() -> None:
    async with serve() as api:
        s = await open_watch(api, create("k"))
        raw = await asyncio.wait_for(s.resp.content.readline(), WAIT_S)
        assert raw == (
            b'{"result":{"header":{"cluster_id":"'
            + CID.encode()
            + b'","member_id":"'
            + MID.encode()
            + b'","revision":"1","raft_term":"2"},"created":true}}\n'
        )
        s.close()


async def test_history_replay_prefix_and_no_prev_kv_unless_asked() -> None:
    async with serve() as api:
        for i in range(3):
            await put(api, f"jobs/{i}", "v")  # revs 2..4
        await put(api, "jobz", "outside")  # rev 5
        await put(api, "jobs/0", "w")  # rev 6
        s = await open_watch(api, create("jobs/", range_end="jobs0", start_revision="3"))
        assert await s.result() == {"header": hdr(6), "created": True}
        replay = await s.result()
        # one response for the whole replay, header = the current revision (as etcd)
        assert replay["header"] == hdr(6)
        assert [(e["kv"]["key"], e["kv"]["mod_revision"]) for e in replay["events"]] == [
            (b64("jobs/1"), "3"),
            (b64("jobs/2"), "4"),
            (b64("jobs/0"), "6"),
        ]
        assert all("prev_kv" not in e for e in replay["events"])
        s.close()


async def test_filters_by_name_and_number_unknown_numbers_ignored() -> None:
    async with serve() as api:
        await put(api, "a", "1")  # 2
        await api.service.delete_range(DeleteRangeRequest(b"a"))  # 3
        await put(api, "a", "2")  # 4
        cases = [
            (["NOPUT"], ["3"]),
            (["NODELETE"], ["2", "4"]),
            ([1], ["2", "4"]),
            ([0, 7], ["3"]),
        ]  # etcd ignores filter numbers it does not know
        for filters, revs in cases:
            s = await open_watch(api, create("a", start_revision="1", filters=filters))
            assert (await s.result())["created"]
            got = await s.result()
            assert [e["kv"]["mod_revision"] for e in got["events"]] == revs, filters
            s.close()
        # Everything filtered out: nothing is sent (etcd: only the created line). A progress
        # request is answered after whatever the stream has queued, so it is a barrier.
        s = await open_watch(
            api, create("a", start_revision="1", filters=["NOPUT", "NODELETE"]), streaming=True
        )
        assert (await s.result())["created"]
        rev = await put(api, "a", "3")
        await s.send({"progress_request": {}})
        assert await s.result() == {"header": hdr(rev), "watch_id": "-1"}
        s.close()


async def test_lower_camel_names_and_user_chosen_watch_ids() -> None:
    async with serve() as api:
        await put(api, "a", "1")
        s = await open_watch(
            api,
            {
                "createRequest": {
                    "key": b64("a"),
                    "startRevision": "2",
                    "prevKv": True,
                    "watchId": "5",
                }
            },
            {"create_request": {"key": b64("a"), "watch_id": "5"}},
        )
        assert await s.result() == {"header": hdr(2), "watch_id": "5", "created": True}
        # etcd: a duplicate id is refused with watch_id -1 and its reason. (Watcher 5's
        # replay may come before or after that answer, as with etcd.)
        two = [await s.result(), await s.result()]
        refusal = next(r for r in two if r["watch_id"] == "-1")
        events = next(r for r in two if r["watch_id"] == "5")
        assert refusal == {
            "header": hdr(2),
            "watch_id": "-1",
            "created": True,
            "canceled": True,
            "cancel_reason": "mvcc: duplicate watch ID provided on the WatchStream",
        }
        assert events["events"][0]["kv"]["mod_revision"] == "2"
        s.close()


async def test_empty_range_is_refused_in_the_stream() -> None:
    async with serve() as api:
        s = await open_watch(api, create("b", range_end="a"))
        assert await s.result() == {
            "header": hdr(1),
            "watch_id": "-1",
            "created": True,
            "canceled": True,
            "cancel_reason": "mvcc: watcher range is empty",
        }
        # The body has ended and no watcher is live: the response ends (etcd hangs).
        assert await s.rest() == b""


async def test_compacted_start_revision() -> None:
    async with serve() as api:
        for i in range(5):
            await put(api, "a", str(i))  # revs 2..6
        await api.service.compact(CompactionRequest(5))
        s = await open_watch(api, create("a", start_revision="3"))
        assert await s.result() == {"header": hdr(6), "created": True}
        # etcd: the compacted answer carries no header revision
        assert await s.result() == {"header": hdr(None), "canceled": True, "compact_revision": "5"}
        assert await s.rest() == b""


async def test_lease_revoke_deletions_are_events() -> None:
    async with serve() as api:
        lease = (await api.service.lease_grant(60)).lease_id
        await put(api, "svc/a", "1", lease=lease)
        await put(api, "svc/b", "1", lease=lease)
        s = await open_watch(api, create("svc/", range_end="svc0"))
        assert (await s.result())["created"]
        await api.service.lease_revoke(lease)
        got = await s.result()
        assert got["header"]["revision"] == "4"
        assert [(e["type"], e["kv"]) for e in got["events"]] == [
            ("DELETE", {"key": b64("svc/a"), "mod_revision": "4"}),
            ("DELETE", {"key": b64("svc/b"), "mod_revision": "4"}),
        ]
        s.close()


async def test_snapshot_restore_keeps_watchers_going() -> None:
    """A restored store (what a snapshot install does) replaces the old one: the watcher
    continues from its next revision out of the new store's history."""
    async with serve() as api:
        await put(api, "k", "1")  # 2
        s = await open_watch(api, create("k"))
        assert (await s.result())["created"]
        other = MVCCStore.restore(list(api.service.store.serialize()))
        other.apply(PutRequest(b"k", b"2"))  # 3: applied on "the leader" while we lagged
        other.apply(PutRequest(b"k", b"3"))  # 4
        api.service.replace_store(other)
        got = await s.result()
        assert [e["kv"]["value"] for e in got["events"]] == [b64("2"), b64("3")]
        await put(api, "k", "4")  # 5, live again
        got = await s.result()
        assert got["events"][0]["kv"]["mod_revision"] == "5"
        s.close()


async def test_fragments_when_asked() -> None:
    service = LocalKV(watch_limits=WatchLimits(max_response_bytes=300))
    async with serve(service) as api:
        for i in range(4):
            await put(api, f"f{i}", "x" * 100)
        s = await open_watch(api, create("f", range_end="g", start_revision="1", fragment=True))
        assert (await s.result())["created"]
        parts = []
        while True:
            parts.append(await s.result())
            if not parts[-1].get("fragment"):
                break
        assert len(parts) > 1 and all(p["header"] == hdr(5) for p in parts)
        assert [e["kv"]["mod_revision"] for p in parts for e in p["events"]] == ["2", "3", "4", "5"]
        s.close()


async def test_v3beta_alias() -> None:
    async with serve() as api:
        s = await open_watch(api, create("k"), path="/v3beta/watch")
        assert await s.result() == {"header": hdr(1), "created": True}
        s.close()


# ---------------------------------------------------------------------------------------------
# A streamed request body: cancel and progress on one connection


async def test_cancel_and_progress_on_a_streamed_body() -> None:
    async with serve() as api:
        s = await open_watch(api, create("a"), streaming=True)
        assert await s.result() == {"header": hdr(1), "created": True}
        await s.send(create("b"))
        assert await s.result() == {"header": hdr(1), "watch_id": "1", "created": True}
        rev = await put(api, "a", "1")
        assert (await s.result())["events"][0]["kv"]["mod_revision"] == str(rev)
        # etcd: progress is {"header":{...},"watch_id":"-1"}
        await s.send({"progress_request": {}})
        assert await s.result() == {"header": hdr(rev), "watch_id": "-1"}
        await s.send({"cancel_request": {"watch_id": "0"}})
        assert await s.result() == {"header": hdr(rev), "canceled": True}
        await s.send({"cancel_request": {"watch_id": "42"}})  # unknown: nothing
        await s.send({})  # asks nothing: ignored
        await put(api, "b", "1")
        got = await s.result()
        assert got["watch_id"] == "1" and got["events"][0]["kv"]["key"] == b64("b")
        assert api.service.watch_hub.watcher_count == 1
        await s.send({"cancel_request": {"watch_id": "1"}})
        assert (await s.result())["canceled"]
        await s.end_body()
        assert await s.rest() == b""  # body over, no watcher left: the response ends
        assert api.service.watch_hub.watcher_count == 0


async def test_bad_object_later_in_the_stream_ends_it_with_an_error_line() -> None:
    async with serve() as api:
        s = await open_watch(api, create("a"), streaming=True)
        assert (await s.result())["created"]
        await s.queue.put(b'{"create_request": {"key": "!!"}}')
        line = await s.line()
        assert set(line) == {"error"}
        err = line["error"]
        assert err["grpc_code"] == 3 and err["http_code"] == 400
        assert err["http_status"] == "Bad Request" and "base64" in err["message"]
        await s.end_body()
        assert await s.rest() == b""
        assert api.service.watch_hub.watcher_count == 0


# ---------------------------------------------------------------------------------------------
# Bad input before the stream starts: an ordinary error response, nothing created


async def test_bad_first_request_is_an_error_response() -> None:
    async with serve() as api:
        cases = [
            b"garbage",
            b"[]",
            b'"text"',
            b'{"create_request": {"key": "!!!"}}',
            b'{"create_request": {"key": "YQ==", "start_revision": true}}',
            b'{"create_request": {"key": "YQ==", "start_revision": "1.5"}}',
            b'{"create_request": {"key": "YQ==", "filters": ["BOGUS"]}}',
            b'{"create_request": {"key": "YQ==", "filters": "NOPUT"}}',
            b'{"create_request": {"key": "YQ==", "prev_kv": "yes"}}',
            b'{"create_request": []}',
            b'{"create_request": {"key": "YQ=="}, "cancel_request": {"watch_id": "0"}}',
            b'{"cancel_request": {"watch_id": "x"}}',
            b'{"progress_request": 1}',
            b'{"create_request": {"key": "YQ=="}',  # cut short
            b"[" * 100_000,
        ]
        for body in cases:
            status, doc = await api.post("/v3/watch", raw=body)
            assert status == 400, (body[:60], status, doc)
            assert doc["code"] == 3 and doc["error"] == doc["message"], body[:60]
            assert doc["error"].startswith("raftkv: "), doc
        assert api.service.watch_hub.watcher_count == 0
        assert api.service.watch_hub.stats["created"] == 0


async def test_oversized_request_object_is_413() -> None:
    async with serve(max_request_bytes=1024) as api:  # objects up to ~525 KiB of JSON
        big = json.dumps(create("a", range_end="b" * 600_000)).encode()
        status, doc = await api.post("/v3/watch", raw=big)
        assert status == 413 and doc["error"] == "etcdserver: request is too large"


async def test_empty_body_or_nothing_asked_ends_at_once() -> None:
    async with serve() as api:
        for body in (b"", b"  \n", b"{}", b'{"create_request": null}', b'{"bogus": 1}'):
            s = await open_watch(api, raw=body)
            assert s.resp.status == 200
            assert await s.rest() == b""


async def test_service_failure_before_the_stream_is_an_error_response() -> None:
    from kvserver.kvpb.service_errors import no_leader

    async with serve() as api:
        api.service.fail_with = no_leader()
        status, doc = await api.post("/v3/watch", create("a"))
        assert status == 503 and doc["error"] == "etcdserver: no leader"


# ---------------------------------------------------------------------------------------------
# Resources: disconnects, slow consumers, shutdown


async def test_client_disconnect_removes_its_watchers() -> None:
    async with serve() as api:
        hub = api.service.watch_hub
        streams = []
        for i in range(5):
            s = await open_watch(api, create(f"k{i}"), create(f"p{i}/", range_end=f"p{i}0"))
            assert (await s.result())["created"] and (await s.result())["created"]
            streams.append(s)
        assert hub.watcher_count == 10
        for s in streams:  # idle streams: nothing is being written to them
            s.close()
        await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "the watchers to be removed")
        assert hub.synced_count == 0


async def test_client_disconnect_mid_body_removes_its_watchers() -> None:
    async with serve() as api:
        hub = api.service.watch_hub
        s = await open_watch(api, create("k"), streaming=True)
        assert (await s.result())["created"]
        assert hub.watcher_count == 1
        s.close()  # the request body never ended
        await async_wait_for(lambda: hub.watcher_count == 0, WAIT_S, "the watcher to be removed")


async def test_slow_consumer_is_canceled_with_a_reason_and_memory_stays_bounded() -> None:
    limits = WatchLimits(max_buffered_events=8, replay_chunk_events=4)
    async with serve(LocalKV(watch_limits=limits)) as api:
        hub = api.service.watch_hub
        s = await open_watch(api, create("k", range_end="l"))
        assert (await s.result())["created"]
        for i in range(200):  # no await in between: the handler cannot write meanwhile
            await api.service.put(PutRequest(f"k{i:03d}".encode(), b"v"))
            assert all(w.buffered_events <= 8 for w in hub._watchers)
        lines = []
        while True:
            lines.append(await s.result())
            if lines[-1].get("canceled"):
                break
        assert lines[-1]["cancel_reason"] == MSG_WATCHER_TOO_SLOW
        got = [int(e["kv"]["mod_revision"]) for r in lines for e in r.get("events", [])]
        assert got == list(range(2, 2 + len(got)))  # a gapless prefix; resume from its end
        assert hub.stats["canceled_slow"] == 1 and hub.watcher_count == 0


async def test_shutdown_ends_open_streams_with_an_unavailable_line() -> None:
    async with serve() as api:
        s = await open_watch(api, create("k"))
        assert (await s.result())["created"]
        reading = asyncio.ensure_future(s.line())
        await api.client.server.close()  # the server shuts down (aiohttp's on_shutdown)
        assert await reading == {
            "error": {
                "grpc_code": 14,
                "http_code": 503,
                "message": "etcdserver: server stopped",
                "http_status": "Service Unavailable",
            }
        }
        assert api.service.watch_hub.watcher_count == 0


async def test_many_revisions_in_one_stream_arrive_in_order_once() -> None:
    async with serve() as api:
        s = await open_watch(api, create("k", range_end="l", start_revision="1"))
        assert (await s.result())["created"]
        revs = [await put(api, f"k{i % 7}", str(i)) for i in range(300)]
        got: list[int] = []
        while len(got) < len(revs):
            got += [int(e["kv"]["mod_revision"]) for e in (await s.result())["events"]]
        assert got == revs
        s.close()


# ---------------------------------------------------------------------------------------------
# Differential: the same watch requests against a real etcd and a real one-member raftkv


def _watch_lines(url: str, body: bytes, n: int, then=None, timeout_s: float = 10.0) -> list:
    """POST /v3/watch and read ``n`` result lines (calling ``then()`` after the first);
    the connection is closed afterwards (etcd never ends a watch stream by itself)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("POST", "/v3/watch", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, (url, resp.status, resp.read(300))
        lines = []
        while len(lines) < n:
            raw = resp.readline()
            if not raw:
                break
            lines.append(json.loads(raw))
            if len(lines) == 1 and then is not None:
                then()
        return lines
    finally:
        conn.close()


def _normalize(doc: Any) -> Any:
    """Drop what differs between two clusters: ids and the raft term."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == "header":
                v = {hk: hv for hk, hv in v.items() if hk == "revision"}
            out[k] = _normalize(v)
        return out
    if isinstance(doc, list):
        return [_normalize(x) for x in doc]
    return doc


def _post(url: str, path: str, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _body(*objects: dict) -> bytes:
    return b"".join(json.dumps(o).encode() for o in objects)


# (name, request objects, lines to read, writes to make after the first line)
_WATCH_SCRIPT: list[tuple[str, bytes, int, list]] = [
    ("replay with prev_kv", _body(create("foo", start_revision="1", prev_kv=True)), 2, []),
    ("replay of a prefix", _body(create("a/", range_end="a0", start_revision="2")), 2, []),
    ("NOPUT filter", _body(create("foo", start_revision="1", filters=["NOPUT"])), 2, []),
    (
        "NODELETE filter by number",
        _body(create("a/", range_end="a0", start_revision="1", filters=[1])),
        2,
        [],
    ),
    ("compaction", b"", 0, [("/v3/kv/compaction", {"revision": "7"})]),
    ("compacted", _body(create("foo", start_revision="2")), 2, []),
    (
        "compacted, with a filter",
        _body(create("a/", range_end="a0", start_revision="6", filters=["NOPUT"])),
        2,
        [],
    ),
    ("at the compact revision", _body(create("a/", range_end="a0", start_revision="7")), 2, []),
    ("empty range", _body(create("b", range_end="a")), 1, []),
    (
        "user watch ids, duplicate refused",
        _body(create("x", watch_id="5"), create("y", watch_id="5")),
        2,
        [],
    ),
    ("progress", _body({"progress_request": {}}), 1, []),
    ("cancel", _body(create("x"), {"cancel_request": {"watch_id": "0"}}), 2, []),
    (
        "live puts with prev_kv",
        _body(create("live", prev_kv=True)),
        3,
        [
            ("/v3/kv/put", {"key": b64("live"), "value": b64("1")}),
            ("/v3/kv/put", {"key": b64("live"), "value": b64("2")}),
        ],
    ),
    (
        "live delete of a range",
        _body(create("live", range_end="livf")),
        2,
        [("/v3/kv/deleterange", {"key": b64("live"), "range_end": b64("livf"), "prev_kv": True})],
    ),
]

_SETUP = [
    ("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")}),  # 2
    ("/v3/kv/put", {"key": b64("foo"), "value": b64("baz")}),  # 3
    ("/v3/kv/deleterange", {"key": b64("foo")}),  # 4
    ("/v3/kv/put", {"key": b64("a/1"), "value": b64("x")}),  # 5
    ("/v3/kv/put", {"key": b64("a/2"), "value": b64("y")}),  # 6
    ("/v3/kv/put", {"key": b64("a/1"), "value": b64("z")}),  # 7
    ("/v3/kv/deleterange", {"key": b64("a/2")}),  # 8
]


def _run_watch_script(url: str) -> list:
    for path, body in _SETUP:
        _post(url, path, body)
    out = []
    for name, body, n, writes in _WATCH_SCRIPT:

        def then(writes=writes):
            for path, req in writes:
                out.append((path, _normalize(_post(url, path, req))))

        if not body:
            then()
            continue
        out.append((name, _normalize(_watch_lines(url, body, n, then))))
    return out


@pytest.mark.slow
@pytest.mark.external
def test_watch_shapes_match_a_real_etcd(tmp_path) -> None:
    """Every line of every scripted watch, field by field (ids and term aside): created,
    replayed and live events, DELETE tombstones, prev_kv, filters, compacted answers (no
    header revision), refusals, user watch ids, progress and cancel."""
    from kvserver.localcluster.launcher import LocalCluster
    from tests.cluster.harness import wait_healthy
    from tests.etcd_process import etcd_process

    with etcd_process(str(tmp_path)) as etcd:
        expected = _run_watch_script(etcd.url)
    cluster = LocalCluster(
        str(tmp_path / "raftkv"),
        size=1,
        extra_args=["--heartbeat-interval", "50", "--election-timeout", "500"],
    )
    cluster.start()
    try:
        wait_healthy(cluster)
        got = _run_watch_script(cluster.nodes[0].client_url)
    finally:
        cluster.stop()
    for (name, want), (_, have) in zip(expected, got, strict=True):
        assert have == want, name
