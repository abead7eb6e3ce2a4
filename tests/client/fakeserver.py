"""A fake raftkv cluster for client tests: N HTTP nodes over one shared in-memory store.

It speaks the etcd v3 JSON gateway dialect as etcd 3.4 does (checked by hand against
``/usr/bin/etcd``; the external test runs the client against the real thing), written
independently of ``kvserver.client.codec`` so that it is an oracle, not a mirror:
``/v3/kv/put|range|deleterange|txn|compaction``, ``/v3/maintenance/status`` (camelCase fields,
as etcd), ``/v3/cluster/member/list`` (optional) and raftkv's ``GET /v1/status`` (ids as hex
strings, as kvserver/api/http/ops.py serves them).

Every node serves reads and writes from the shared store (like a follower that forwards to the
leader), so the tests see routing only through what each node *received*. Knobs:

- ``cluster.leader_id`` — what every node reports as leader (0 = none);
- ``node.script`` — actions for the next requests to that node whose path matches:
  ``Fail(status, code, message)`` answers an error without touching the store;
  ``Hang(seconds, apply=True)`` applies the request, then waits before answering (a write
  that succeeded but whose answer came too late);
- ``node.received`` — every request: path, body and the client/request-id headers;
- ``node.stop()`` / ``node.start()`` — a crashed node refuses connections.

Writes with an ``X-Raftkv-Client-Id``/``X-Raftkv-Request-Id`` pair are deduplicated: a pair
seen before gets the first answer again and changes nothing.

The servers run on an event loop in a background thread, so tests may use the blocking client,
the CLI (``asyncio.run``) or async tests from the main thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

CLIENT_ID_HEADER = "X-Raftkv-Client-Id"
REQUEST_ID_HEADER = "X-Raftkv-Request-Id"
CLUSTER_ID = 0x1C2D3E4F5A6B7C8D


def _b64d(text: str | None) -> bytes:
    return base64.b64decode(text or "", validate=True)


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _int(raw: Any) -> int:
    return int(raw or 0)


@dataclass
class Fail:
    status: int
    code: int
    message: str
    path: str = ""  # "" = any path


@dataclass
class Hang:
    seconds: float
    apply: bool = True
    path: str = ""


@dataclass
class Received:
    path: str
    body: Any
    client_id: str | None
    request_id: str | None


@dataclass
class _Key:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class BadRequest(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


COMPACTED = BadRequest(400, 11, "etcdserver: mvcc: required revision has been compacted")
FUTURE = BadRequest(400, 11, "etcdserver: mvcc: required revision is a future revision")
NO_KEY = BadRequest(400, 3, "etcdserver: key is not provided")


def prefix_end(prefix: bytes) -> bytes:
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


class Store:
    """Just enough of etcd's KV semantics for client tests (current revision only)."""

    def __init__(self) -> None:
        self.keys: dict[bytes, _Key] = {}
        self.revision = 1
        self.compact_revision = 0
        self.applied: list[str] = []  # one entry per write that changed the store

    def _select(self, key: bytes, end: bytes) -> list[bytes]:
        if not end:
            return [key] if key in self.keys else []
        if end == b"\0":
            return sorted(k for k in self.keys if k >= key)
        return sorted(k for k in self.keys if key <= k < end)

    def _kv(self, k: bytes, keys_only: bool = False) -> dict[str, Any]:
        e = self.keys[k]
        doc: dict[str, Any] = {
            "key": _b64e(k),
            "create_revision": str(e.create_revision),
            "mod_revision": str(e.mod_revision),
            "version": str(e.version),
        }
        if e.value and not keys_only:
            doc["value"] = _b64e(e.value)
        if e.lease:
            doc["lease"] = str(e.lease)
        return doc

    def range(self, body: dict) -> dict:
        key = _b64d(body.get("key"))
        if not key:
            raise NO_KEY
        rev = _int(body.get("revision"))
        if rev and rev < self.compact_revision:
            raise COMPACTED
        if rev > self.revision:
            raise FUTURE
        keys = self._select(key, _b64d(body.get("range_end")))
        if body.get("sort_order") in ("DESCEND", 2):
            keys.reverse()
        out: dict[str, Any] = {}
        limit = _int(body.get("limit"))
        shown = keys[:limit] if limit else keys
        if not body.get("count_only") and shown:
            out["kvs"] = [self._kv(k, bool(body.get("keys_only"))) for k in shown]
        if len(shown) < len(keys):
            out["more"] = True
        if keys:
            out["count"] = str(len(keys))
        return out

    def put(self, body: dict, rev: int) -> dict:
        key = _b64d(body.get("key"))
        if not key:
            raise NO_KEY
        old = self.keys.get(key)
        out: dict[str, Any] = {}
        if old is not None and body.get("prev_kv"):
            out["prev_kv"] = self._kv(key)
        self.keys[key] = _Key(
            _b64d(body.get("value")),
            old.create_revision if old else rev,
            rev,
            old.version + 1 if old else 1,
            _int(body.get("lease")),
        )
        return out

    def delete(self, body: dict, rev: int) -> dict:
        key = _b64d(body.get("key"))
        if not key:
            raise NO_KEY
        keys = self._select(key, _b64d(body.get("range_end")))
        out: dict[str, Any] = {}
        if keys:
            out["deleted"] = str(len(keys))
        if keys and body.get("prev_kv"):
            out["prev_kvs"] = [self._kv(k) for k in keys]
        for k in keys:
            del self.keys[k]
        return out

    def _compare(self, c: dict) -> bool:
        e = self.keys.get(_b64d(c.get("key")))
        target = c.get("target", "VERSION")
        if target == "VALUE":
            have: Any = e.value if e else b""
            want: Any = _b64d(c.get("value"))
        else:
            field_name = {
                "VERSION": "version",
                "CREATE": "create_revision",
                "MOD": "mod_revision",
                "LEASE": "lease",
            }[target]
            have = getattr(e, field_name) if e else 0
            want = _int(c.get(field_name))
        result = c.get("result", "EQUAL")
        return {
            "EQUAL": have == want,
            "NOT_EQUAL": have != want,
            "LESS": have < want,
            "GREATER": have > want,
        }[result]

    def txn(self, body: dict, rev: int) -> tuple[dict, bool]:
        ok = all(self._compare(c) for c in body.get("compare", []))
        responses = []
        wrote = False
        for op in body.get("success" if ok else "failure", []):
            if "request_put" in op:
                r = self.put(op["request_put"], rev)
                wrote = True
                responses.append({"response_put": {"header": {"revision": str(rev)}, **r}})
            elif "request_range" in op:
                r = self.range(op["request_range"])
                responses.append(
                    {"response_range": {"header": {"revision": str(self.revision)}, **r}}
                )
            elif "request_delete_range" in op:
                r = self.delete(op["request_delete_range"], rev)
                wrote = wrote or "deleted" in r
                responses.append({"response_delete_range": {"header": {"revision": str(rev)}, **r}})
        out: dict[str, Any] = {}
        if ok:
            out["succeeded"] = True
        if responses:
            out["responses"] = responses
        return out, wrote

    def apply(self, path: str, body: dict) -> dict:
        """Apply one request; the answer without header (its revision is ``self.revision``)."""
        if path == "/v3/kv/range":
            return self.range(body)
        nxt = self.revision + 1
        if path == "/v3/kv/put":
            out = self.put(body, nxt)
            wrote = True
        elif path == "/v3/kv/deleterange":
            out = self.delete(body, nxt)
            wrote = "deleted" in out
        elif path == "/v3/kv/txn":
            out, wrote = self.txn(body, nxt)
        elif path == "/v3/kv/compaction":
            rev = _int(body.get("revision"))
            if rev <= self.compact_revision:
                raise COMPACTED
            if rev > self.revision:
                raise FUTURE
            self.compact_revision = rev
            self.applied.append(f"compact {rev}")
            return {}
        else:
            raise BadRequest(404, 5, "unknown path")
        if wrote:
            self.revision = nxt
            self.applied.append(path)
        return out


class FakeNode:
    def __init__(self, cluster: FakeCluster, index: int) -> None:
        self.cluster = cluster
        self.name = f"n{index + 1}"
        self.member_id = 0x1000 + index + 1
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.received: list[Received] = []
        self.script: deque[Fail | Hang] = deque()
        self._runner: web.AppRunner | None = None

    # -- control (from the test thread)

    def start(self) -> None:
        self.cluster.loop_thread.run(self._start())

    def stop(self) -> None:
        self.cluster.loop_thread.run(self._stop())

    def paths(self) -> list[str]:
        return [r.path for r in self.received]

    def kv_requests(self) -> list[Received]:
        return [r for r in self.received if r.path.startswith("/v3/kv/")]

    # -- server side (on the loop thread)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        await web.SockSite(self._runner, sock).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def _next_action(self, path: str) -> Fail | Hang | None:
        for action in list(self.script):
            if not action.path or action.path == path:
                self.script.remove(action)
                return action
        return None

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return _error(400, 3, "invalid character in JSON")
        self.received.append(
            Received(
                path,
                body,
                request.headers.get(CLIENT_ID_HEADER),
                request.headers.get(REQUEST_ID_HEADER),
            )
        )
        action = self._next_action(path)
        if isinstance(action, Fail):
            return _error(action.status, action.code, action.message)
        try:
            response = self._serve(request.method, path, body, request.headers)
        except BadRequest as err:
            response = _error(err.status, err.code, err.message)
        if isinstance(action, Hang):
            await asyncio.sleep(action.seconds)
        return response

    def _header(self) -> dict[str, str]:
        return {
            "cluster_id": str(CLUSTER_ID),
            "member_id": str(self.member_id),
            "revision": str(self.cluster.store.revision),
            "raft_term": str(self.cluster.term),
        }

    def _serve(self, method: str, path: str, body: Any, headers) -> web.Response:
        cluster = self.cluster
        if path == "/v1/status" and method == "GET":
            return web.json_response(
                {
                    "id": f"{self.member_id:x}",
                    "name": self.name,
                    "leader": f"{cluster.leader_id:x}" if cluster.leader_id else None,
                    "term": cluster.term,
                    "members": [
                        {
                            "id": f"{n.member_id:x}",
                            "name": n.name,
                            "peer_urls": [f"http://127.0.0.1:{n.port + 1}"],
                            "client_urls": [n.url],
                        }
                        for n in cluster.nodes
                    ],
                }
            )
        if method != "POST":
            return _error(405, 12, "method not allowed")
        if path == "/v3/maintenance/status":
            doc = {
                "header": self._header(),
                "version": "3.5.0",
                "dbSize": "24576",
                "leader": str(cluster.leader_id),
                "raftIndex": str(cluster.raft_index()),
                "raftTerm": str(cluster.term),
                "raftAppliedIndex": str(cluster.raft_index()),
                "dbSizeInUse": "16384",
            }
            if not cluster.leader_id:
                del doc["leader"]
            return web.json_response(doc)
        if path == "/v3/cluster/member/list":
            if not cluster.serve_member_list:
                return web.Response(status=404, text="404 page not found")
            return web.json_response(
                {
                    "header": self._header(),
                    "members": [
                        {
                            "ID": str(n.member_id),
                            "name": n.name,
                            "peerURLs": [f"http://127.0.0.1:{n.port + 1}"],
                            "clientURLs": [n.url],
                        }
                        for n in cluster.nodes
                    ],
                }
            )
        if not isinstance(body, dict):
            raise BadRequest(400, 3, "body is not an object")
        pair = (headers.get(CLIENT_ID_HEADER), headers.get(REQUEST_ID_HEADER))
        is_write = path != "/v3/kv/range"
        if is_write and pair[0] and pair in cluster.seen:
            return web.json_response(cluster.seen[pair])
        out = cluster.store.apply(path, body)
        doc = {"header": self._header(), **out}
        if is_write and pair[0]:
            cluster.seen[pair] = doc
        return web.json_response(doc)


def _error(status: int, code: int, message: str) -> web.Response:
    return web.json_response({"error": message, "code": code, "message": message}, status=status)


# Client options for tests: short timeouts and backoffs, so failover is exercised quickly.
FAST = dict(
    timeout_s=3.0,
    attempt_timeout_s=0.5,
    connect_timeout_s=0.3,
    backoff_initial_s=0.01,
    backoff_max_s=0.05,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopThread:
    """An event loop on a daemon thread; ``run(coro)`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fake-cluster", daemon=True
        )
        self.thread.start()

    def run(self, coro, timeout_s: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@dataclass
class FakeCluster:
    size: int = 3
    leader_index: int | None = 0
    serve_member_list: bool = True
    term: int = 2
    nodes: list[FakeNode] = field(default_factory=list)
    store: Store = field(default_factory=Store)
    seen: dict[tuple[str | None, str | None], dict] = field(default_factory=dict)
    leader_id: int = 0

    def __post_init__(self) -> None:
        self.loop_thread = LoopThread()
        self.nodes = [FakeNode(self, i) for i in range(self.size)]
        if self.leader_index is not None:
            self.leader_id = self.nodes[self.leader_index].member_id

    def raft_index(self) -> int:
        return 10 + len(self.store.applied)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self) -> FakeCluster:
        for node in self.nodes:
            node.start()
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self.loop_thread.close()

    def set_leader(self, index: int | None) -> None:
        self.leader_id = 0 if index is None else self.nodes[index].member_id
        self.term += 1


class Blackhole:
    """A port that accepts TCP connections (kernel backlog) but never answers: a hung node."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def dead_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    return f"http://127.0.0.1:{_free_port()}"
