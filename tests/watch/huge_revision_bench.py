"""How long one revision with N delete events holds a member's event loop, end to end.

Run: ``.venv/bin/python -m tests.watch.huge_revision_bench --keys 200000`` (heavy: under
``flock /work/notes/bench.lock``). Not a test (no ``test_`` name): a measurement.

One in-process member (single-member cluster, its data in a temporary directory) gets N keys
under ``p/`` (txns of ``--batch`` puts, bypassing the client's max-txn-ops), then two client
processes open a prefix watch each, one through the gRPC Watch service and one through the
JSON gateway's ``POST /v3/watch``; the member then deletes the prefix (one revision, applied
in steps) while a ticker task on its loop records the longest gap between its wake-ups
beyond the sleep it asked for. Each client checks that it got N DELETE events, at one
revision, in key order, exactly once, and reports its last receive time. The ticker runs
until both clients are done, so the hold covers applying, matching, encoding and sending.

With ``--replay`` the member deletes the prefix first and the clients then open their
watches from the delete's revision: the events come from the store's history (a watcher
catching up), not from the live notification. The hold is then measured from the clients'
start.

Also reported: the longest hold once the delete was applied (the watch's share), the longest
single call of the hub's ``notify`` and ``poll`` and of the small-response encoders, with
and without the cyclic GC passes that ran inside them, and the full GC passes meanwhile. The
member's loop monitor logs the loop thread's stack for every hold over ``--warn-after-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import gc
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = b"p/"
PREFIX_END = b"p0"
TICK_S = 0.002


def key(i: int) -> bytes:
    return PREFIX + b"%07d" % i


# --- clients (separate processes, so their decoding is not on the member's loop) -----------


def _check(keys: list[bytes], revs: set[int], n: int) -> dict:
    return {
        "events": len(keys),
        "revisions": sorted(revs),
        "in_order": keys == [key(i) for i in range(n)],
    }


async def grpc_client(target: str, n: int, start_rev: int) -> dict:
    import grpc

    from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc

    opts = [("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(target, options=opts) as channel:
        call = rpc_pb2_grpc.WatchStub(channel).Watch()
        await call.write(
            rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(
                    key=PREFIX, range_end=PREFIX_END, start_revision=start_rev
                )
            )
        )
        first = await call.read()
        assert first.created, first
        print("ready", flush=True)
        keys: list[bytes] = []
        revs: set[int] = set()
        responses = 0
        types: set[str] = set()
        while len(keys) < n:
            resp = await call.read()
            responses += 1
            for ev in resp.events:
                types.add("DELETE" if ev.type == 1 else "PUT")
                keys.append(ev.kv.key)
                revs.add(ev.kv.mod_revision)
        done = time.time()
        call.cancel()
    out = {"client": "grpc", "responses": responses, "done": done, "types": sorted(types)}
    return {**out, **_check(keys, revs, n)}


async def http_client(url: str, n: int, start_rev: int) -> dict:
    import aiohttp

    body = json.dumps(
        {
            "create_request": {
                "key": base64.b64encode(PREFIX).decode(),
                "range_end": base64.b64encode(PREFIX_END).decode(),
                "start_revision": start_rev,
            }
        }
    )
    keys: list[bytes] = []
    revs: set[int] = set()
    responses = 0
    types: set[str] = set()
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url + "/v3/watch", data=body) as r:
            buf = bytearray()

            async def next_line() -> bytes:
                while (end := buf.find(b"\n")) < 0:
                    chunk = await r.content.readany()
                    if not chunk:
                        return b""
                    buf.extend(chunk)
                line = bytes(buf[: end + 1])
                del buf[: end + 1]
                return line

            first = json.loads(await next_line())
            assert first["result"].get("created"), first
            print("ready", flush=True)
            while len(keys) < n:
                line = await next_line()
                if not line:
                    break
                result = json.loads(line)["result"]
                responses += 1
                for ev in result.get("events", ()):
                    types.add(ev.get("type", "PUT"))
                    keys.append(base64.b64decode(ev["kv"]["key"]))
                    revs.add(int(ev["kv"]["mod_revision"]))
            done = time.time()
    out = {"client": "http", "responses": responses, "done": done, "types": sorted(types)}
    return {**out, **_check(keys, revs, n)}


# --- the member ---------------------------------------------------------------------------


STEPS: dict[str, float] = {}  # the longest single call of each wrapped step, in seconds
GC_PASSES: list[tuple[int, float, float]] = []  # (generation, ended at, seconds)
_gc_started = 0.0
_gc_total = 0.0  # seconds spent in the collector so far


def _on_gc(phase: str, info: dict) -> None:
    global _gc_started, _gc_total
    if phase == "start":
        _gc_started = time.monotonic()
    else:
        now = time.monotonic()
        GC_PASSES.append((info["generation"], now, now - _gc_started))
        _gc_total += now - _gc_started


def _timed(owner: object, name: str, label: str) -> None:
    """Wrap ``owner.name`` (a synchronous function run on the loop) to record its longest
    call under ``label``."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.monotonic()
        gc_before = _gc_total
        try:
            return fn(*args, **kwargs)
        finally:
            d = time.monotonic() - t
            if d > STEPS.get(label, 0.0):
                STEPS[label] = d
            d -= _gc_total - gc_before  # the collector's passes inside the call
            if d > STEPS.get(label + " (without gc)", 0.0):
                STEPS[label + " (without gc)"] = d

    setattr(owner, name, wrapper)


def _wrap_steps() -> None:
    """The loop steps a huge revision goes through on its way to a watcher."""
    from kvserver.api.grpc import watch as grpc_watch
    from kvserver.api.http import watch as http_watch
    from kvserver.watch import hub

    _timed(hub.WatchHub, "notify", "hub.notify")
    _timed(hub.WatchStream, "poll", "stream.poll")
    _timed(http_watch, "encode_watch_line", "http encode_watch_line")
    _timed(grpc_watch, "encode_response", "grpc encode_response")


async def member_run(
    n: int, batch: int, clients: list[str], warn_after_s: float, replay: bool
) -> dict:
    from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest, RequestOp, TxnRequest
    from tests.support.grpc_members import target
    from tests.support.inprocess import configs, running, wait_leader

    _wrap_steps()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = configs(Path(tmp))[0]
        cfg = dataclasses.replace(  # one member, etcd's default raft timing
            cfg,
            initial_cluster=cfg.initial_cluster.split(",")[0],
            members=tuple(m for m in cfg.members if m.name == cfg.name),
            heartbeat_interval_ms=100,
            election_timeout_ms=1000,
        )
        async with running([cfg]) as (member,):
            await wait_leader([member])
            kv = member.kv
            assert kv is not None
            kv.max_txn_ops = kv.store.max_txn_ops = max(kv.max_txn_ops, batch)
            t0 = time.monotonic()
            for lo in range(0, n, batch):
                ops = tuple(
                    RequestOp(request_put=PutRequest(key(i), b"v"))
                    for i in range(lo, min(lo + batch, n))
                )
                await kv.txn(TxnRequest((), ops, ()))
            load_s = time.monotonic() - t0
            url = member.cfg.advertise_client_urls[0]
            start_rev = 0
            if replay:  # the events are in history before any watcher asks for them
                deleted = await kv.delete_range(DeleteRangeRequest(PREFIX, PREFIX_END))
                assert deleted.deleted == n, deleted.deleted
                start_rev = deleted.header.revision

            longest = 0.0
            worst_at = 0.0
            stop = False
            holds: list[tuple[float, float]] = []  # (when it ended, how long), over 5 ms

            async def ticker() -> None:
                nonlocal longest, worst_at
                while not stop:
                    before = time.monotonic()
                    await asyncio.sleep(TICK_S)
                    now = time.monotonic()
                    late = now - before - TICK_S
                    if late > 0.005:
                        holds.append((now, late))
                    if late > longest:
                        longest, worst_at = late, now

            member.loop_monitor.longest_stall_s = 0.0
            member.loop_monitor.warn_after_s = warn_after_s  # the stack of every such hold
            STEPS.clear()
            gc.callbacks.append(_on_gc)
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.2)
            t_delete = t_applied = time.monotonic()
            wall_delete = time.time()
            procs = []
            for kind in clients:
                where = target(member) if kind == "grpc" else url
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "tests.watch.huge_revision_bench",
                        "--client",
                        kind,
                        "--target",
                        where,
                        "--keys",
                        str(n),
                        "--start-revision",
                        str(start_rev),
                        stdout=subprocess.PIPE,
                    )
                )
            for p in procs:
                assert p.stdout is not None
                line = await asyncio.wait_for(p.stdout.readline(), 60)
                assert line.strip() == b"ready", line
            if not replay:
                t_delete = time.monotonic()
                wall_delete = time.time()
                resp = await kv.delete_range(DeleteRangeRequest(PREFIX, PREFIX_END))
                t_applied = time.monotonic()
                assert resp.deleted == n, resp.deleted
            applied_s = t_applied - t_delete
            reports = []
            for p in procs:
                out, _ = await asyncio.wait_for(p.communicate(), 1200)
                reports.append(json.loads(out.decode().strip().splitlines()[-1]))
            stop = True
            await tick
            for r in reports:
                r["delivered_s"] = round(r.pop("done") - wall_delete, 3)
            return {
                "keys": n,
                "clients": clients,
                "events_from": "history (--replay)" if replay else "the live notification",
                "load_s": round(load_s, 1),
                "delete_applied_s": round(applied_s, 3),
                "longest_loop_hold_ms": round(longest * 1000, 1),
                "longest_hold_after_delete_s": round(worst_at - t_delete, 3),
                # holds that started once the delete was applied: the watch's share
                "longest_hold_while_delivering_ms": round(
                    max((late for end, late in holds if end - late >= t_applied), default=0.0)
                    * 1000,
                    1,
                ),
                "holds_over_20ms_while_delivering": sum(
                    1 for end, late in holds if end - late >= t_applied and late > 0.02
                ),
                "loop_monitor_longest_stall_ms": round(
                    member.loop_monitor.longest_stall_s * 1000, 1
                ),
                "longest_step_ms": {k: round(v * 1000, 1) for k, v in STEPS.items()},
                "gc_full_passes_while_delivering": {
                    "count": len(
                        full := [d for g, end, d in GC_PASSES if g == 2 and end > t_applied]
                    ),
                    "longest_ms": round(max(full, default=0.0) * 1000, 1),
                },
                "clients_report": reports,
            }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--clients", default="grpc,http", help="grpc, http or grpc,http")
    ap.add_argument(
        "--warn-after-ms",
        type=float,
        default=40.0,
        help="log the loop's stack for every hold longer than this (the loop monitor's watchdog)",
    )
    ap.add_argument(
        "--replay",
        action="store_true",
        help="delete first, then watch from the delete's revision (a catch-up from history)",
    )
    ap.add_argument("--start-revision", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--client", choices=("grpc", "http"), help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client == "grpc":
        print(json.dumps(asyncio.run(grpc_client(args.target, args.keys, args.start_revision))))
    elif args.client == "http":
        print(json.dumps(asyncio.run(http_client(args.target, args.keys, args.start_revision))))
    else:
        # the loop monitor's warnings name what held the loop (its stack), on stderr
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        report = asyncio.run(
            member_run(
                args.keys,
                args.batch,
                args.clients.split(","),
                args.warn_after_ms / 1000,
                args.replay,
            )
        )
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
