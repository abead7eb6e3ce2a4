"""A three-node PySyncObj key-value store behind aiohttp: the comparison point in compare.py.

One process per node::

    python benchmarks/pysyncobj_kv.py --raft 127.0.0.1:7001 --partners 127.0.0.1:7002,127.0.0.1:7003 \\
        --http 127.0.0.1:8001 --journal /tmp/n1.journal

It serves the subset of etcd's JSON gateway the load generator (``raftkv bench``) uses, with
etcd's shapes (base64 keys and values, 64-bit numbers as strings):

- ``POST /v3/kv/put`` ``{"key", "value"}`` → ``{"header": {...revision...}}``. The write is a
  PySyncObj ``@replicated`` call; the answer is sent from its callback, i.e. only after the
  entry is committed by a majority and applied (``FAIL_REASON.SUCCESS``); any other outcome
  is an HTTP 503 in etcd's error shape.
- ``POST /v3/kv/range`` ``{"key", "range_end"?, "limit"?, "count_only"?, "keys_only"?,
  "serializable"?}``. Serializable reads answer from the local copy. PySyncObj has no
  ReadIndex, so a linearizable read waits for a replicated no-op (``barrier``) to be applied
  here; reads arriving while a barrier is in flight share the next one (batched, like
  raftkv's ReadIndex rounds).
- ``POST /v3/maintenance/status`` → ``{"header": {"member_id"}, "leader", "raftTerm"}``
  (member ids are the raft ports), so ``--target-leader`` and compare.py find the leader.

PySyncObj setup (``SyncObjConf``): ``journalFile`` on disk (PySyncObj writes it through
mmap and does not fsync per entry), ``appendEntriesUseBatch=False`` (send appends as soon as
commands arrive instead of every ``appendEntriesPeriod``: much lower latency at low load),
``autoTickPeriod=0.002`` s, election timeouts 0.4..1.4 s, log compaction effectively off
during a benchmark run (it would fork and pause the node).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import threading

from aiohttp import web
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated


class KVStore(SyncObj):
    """The replicated state: key -> [value, create_revision, mod_revision, version]."""

    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, partners, conf)
        self.data: dict[bytes, list] = {}
        self.rev = 1

    @replicated
    def put(self, key: bytes, value: bytes) -> int:
        self.rev += 1
        kv = self.data.get(key)
        if kv is None:
            self.data[key] = [value, self.rev, self.rev, 1]
        else:
            kv[0], kv[2], kv[3] = value, self.rev, kv[3] + 1
        return self.rev

    @replicated
    def barrier(self) -> int:
        return self.rev


def make_conf(journal: str, *, batch: bool = False) -> SyncObjConf:
    return SyncObjConf(
        journalFile=journal,
        appendEntriesUseBatch=batch,
        autoTickPeriod=0.002,
        raftMinTimeout=0.4,
        raftMaxTimeout=1.4,
        connectionRetryTime=0.5,
        logCompactionMinEntries=1 << 40,
        logCompactionMinTime=1 << 40,
        dynamicMembershipChange=False,
        commandsQueueSize=1 << 20,
    )


def _port(addr) -> int:
    return int(str(addr).rsplit(":", 1)[1])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _error(status: int, code: int, message: str) -> web.Response:
    return web.json_response({"error": message, "message": message, "code": code}, status=status)


class Server:
    def __init__(self, kv: KVStore, raft_addr: str) -> None:
        self.kv = kv
        self.member_id = _port(raft_addr)
        self._read_waiters: list[asyncio.Future] = []
        self._barrier_in_flight = False

    def header(self, revision: int) -> dict:
        return {
            "cluster_id": "1",
            "member_id": str(self.member_id),
            "revision": str(revision),
            "raft_term": str(self.kv.raftCurrentTerm),
        }

    async def _replicated(self, call, *args) -> int:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(result, error) -> None:  # on PySyncObj's thread
            loop.call_soon_threadsafe(_settle, fut, result, error)

        call(*args, callback=done)
        return await fut

    async def put(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            key = base64.b64decode(body["key"], validate=True)
            value = base64.b64decode(body.get("value", ""), validate=True)
        except (ValueError, KeyError, TypeError):
            return _error(400, 3, "bad put request")
        if not key:
            return _error(400, 3, "etcdserver: key is not provided")
        try:
            rev = await self._replicated(self.kv.put, key, value)
        except RuntimeError as exc:
            return _error(503, 14, str(exc))
        return web.json_response({"header": self.header(rev)})

    async def _read_barrier(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._read_waiters.append(fut)
        if not self._barrier_in_flight:
            asyncio.ensure_future(self._run_barriers())
        await fut

    async def _run_barriers(self) -> None:
        self._barrier_in_flight = True
        try:
            while self._read_waiters:
                batch, self._read_waiters = self._read_waiters, []
                try:
                    await self._replicated(self.kv.barrier)
                    for f in batch:
                        if not f.done():
                            f.set_result(None)
                except RuntimeError as exc:
                    for f in batch:
                        if not f.done():
                            f.set_exception(exc)
        finally:
            self._barrier_in_flight = False

    async def range(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            key = base64.b64decode(body["key"], validate=True)
            end = base64.b64decode(body.get("range_end", ""), validate=True)
            limit = int(body.get("limit", 0))
        except (ValueError, KeyError, TypeError):
            return _error(400, 3, "bad range request")
        if not body.get("serializable"):
            try:
                await self._read_barrier()
            except RuntimeError as exc:
                return _error(503, 14, str(exc))
        data, rev = self.kv.data, self.kv.rev
        if not end:
            keys = [key] if key in data else []
        elif end == b"\0":
            keys = sorted(k for k in data if k >= key)
        else:
            keys = sorted(k for k in data if key <= k < end)
        out: dict = {"header": self.header(rev)}
        if keys:
            out["count"] = str(len(keys))
        if body.get("count_only"):
            return web.json_response(out)
        shown = keys[:limit] if limit > 0 else keys
        if len(shown) < len(keys):
            out["more"] = True
        kvs = []
        for k in shown:
            value, create, mod, version = data[k]
            item = {
                "key": _b64(k),
                "create_revision": str(create),
                "mod_revision": str(mod),
                "version": str(version),
            }
            if not body.get("keys_only") and value:
                item["value"] = _b64(value)
            kvs.append(item)
        if kvs:
            out["kvs"] = kvs
        return web.json_response(out)

    async def status(self, request: web.Request) -> web.Response:
        leader = self.kv._getLeader()
        return web.json_response(
            {
                "header": self.header(self.kv.rev),
                "version": "pysyncobj",
                "leader": str(_port(leader)) if leader is not None else "0",
                "raftTerm": str(self.kv.raftCurrentTerm),
                "raftIndex": str(self.kv.raftCommitIndex),
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v3/kv/put", self.put),
                web.post("/v3/kv/range", self.range),
                web.post("/v3/maintenance/status", self.status),
            ]
        )
        return app


def _settle(fut: asyncio.Future, result, error) -> None:
    if fut.done():
        return
    if error == FAIL_REASON.SUCCESS:
        fut.set_result(result)
    else:
        fut.set_exception(RuntimeError(f"pysyncobj: command failed (FAIL_REASON {error})"))


async def serve(args) -> None:
    kv = KVStore(
        args.raft,
        [p for p in args.partners.split(",") if p],
        make_conf(args.journal, batch=args.batch),
    )
    server = Server(kv, args.raft)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    host, port = args.http.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port), reuse_address=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"serving": args.http, "raft": args.raft}), flush=True)
    await stop.wait()
    await runner.cleanup()
    kv.destroy()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raft", required=True, help="this node's raft address HOST:PORT")
    ap.add_argument("--partners", default="", help="the other nodes' raft addresses")
    ap.add_argument("--http", required=True, help="client address HOST:PORT")
    ap.add_argument("--journal", required=True, help="journal file path")
    ap.add_argument(
        "--batch",
        action="store_true",
        help="appendEntriesUseBatch=True (appends every appendEntriesPeriod)",
    )
    args = ap.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.journal)), exist_ok=True)
    threading.current_thread().name = "aiohttp"
    try:
        import uvloop

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
