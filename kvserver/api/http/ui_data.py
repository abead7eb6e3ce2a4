"""The dashboard's JSON endpoints (``/ui/api/...``): what the gateway does not already answer.

Everything else the page shows comes from the gateway itself (``/v3/kv/range`` with
``keys_only`` and ``limit`` for the key tree, ``/v3/watch`` for the live tail, ``/v3/lease/*``,
``/v3/auth/*``), with the user's token, so auth applies exactly as for any client.

Open like ``/v1/status`` and ``/metrics`` (no token needed):

``GET /ui/api/config`` — ``{"write": bool, "auth_enabled": bool, "member": {id, name}}``.
``GET /ui/api/local`` — this member: ``ops.status_json`` plus ``role`` (leader, follower,
  candidate...), ``leader_changes``, ``pending_proposals``, ``quota_backend_bytes``,
  ``alarms`` (etcd's ``memberID:<id> alarm:<TYPE>`` strings) and, on the leader,
  ``progress``: ``{member id hex: {"match", "next", "state", "recent_active"}}``.
``GET /ui/api/cluster`` — every member's ``local`` view: this member's directly, the others'
  fetched from their first client URL (all at once, ``PEER_TIMEOUT_S`` each); a member that
  does not answer is listed with ``"reachable": false`` and the error. The leader's
  ``progress`` gives each follower's ``match`` and ``lag`` (leader commit - match).
``GET /ui/api/metrics`` — cumulative counters the page turns into rates and p99s over time:
  ``{"t": unix seconds, "members": [ids], "revision", "proposals_committed",
  "proposals_failed", "proposals_pending", "leader_changes", "reads", "writes", "latency":
  {"le": [...], "counts": [...]}, "fsync": {"le", "counts"}}`` (histogram counts cumulative
  per bucket, ``latency`` over the gateway's and the REST dialect's key-value routes).
  ``?scope=cluster``: the same summed over every member that answers in time (``members``
  lists them; the page starts its rates afresh when that list changes).
``GET /ui/api/archive`` — ``{"enabled": false}`` without ``--archive-url``; else the lag,
  the manifest's last update (``last_upload_unix``), and what a point-in-time restore can
  reach: from the oldest archived snapshot (index, revision, and the time the archive held
  it, from the manifest's timeline) to the newest archived commit index and its time.

Need a token when auth is enabled (``ui_user``), and read only what the user may read:

``GET /ui/api/history?key=<base64>`` — every version of one key still in the store's history,
  oldest first, from the compact revision on: ``{"key", "revision", "compact_revision",
  "versions": [{"type": "PUT"|"DELETE", "mod_revision", "create_revision", "version",
  "lease", "value" (base64)}], "truncated": bool}``; the newest ``MAX_VERSIONS`` are kept.
  The store's change log is read from the compact revision in slices of
  ``HISTORY_SCAN_RECORDS`` records, one slice per loop turn.
``GET /ui/api/pipelines`` — the Spark coordination keys, read from the store
  (``kvserver.spark``'s layouts): ``locks`` (``<locks prefix><name>/<lease id hex>``; per
  name the holder — the smallest create revision —, its fencing token and lease, and the
  waiters in queue order), ``commitlogs`` (``<commitlog prefix><table>/v/<20 digits>``; per
  table the number of versions seen and the newest ``TABLE_VERSIONS`` with revision, payload,
  and committer, time and fence from the commit's record ``<table>/m/<20 digits>``, or from
  the payload when it has such fields), ``batches`` (exactly-once
  markers ``<batches prefix><name>/<batch id, 20 digits>``: count, last batch id, when it
  finished). Each section reads at most ``PIPELINE_SCAN_KEYS`` keys (``truncated`` says so);
  a section the user may not read is ``{"denied": true}``.

Write actions (``--ui-write`` only, else 403; with auth, the gateway's own permission checks):
``POST /ui/api/kv/put {"key", "value"}`` (base64), ``POST /ui/api/kv/delete {"key"}``,
``POST /ui/api/move-leader {"to": member id hex}`` (root only with auth; a follower forwards
it to the leader as the gateway's transfer-leadership does).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections import deque
from typing import Any

import aiohttp
from aiohttp import web

from kvserver.auth import errors as auth_errors
from kvserver.kvpb.kv import (
    DeleteRangeRequest,
    KeyValue,
    PutRequest,
    RangeRequest,
    prefix_range_end,
)
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from . import auth as http_auth
from . import forward, ops
from .common import LIMITS_KEY, METRICS_KEY, SERVICE_KEY, dumps, json_response, read_body
from .ui import PREFIX, ui_config

API = PREFIX + "/api"
PEER_TIMEOUT_S = 1.5
MAX_VERSIONS = 1000
HISTORY_SCAN_RECORDS = 8192
PIPELINE_SCAN_KEYS = 5000
TABLE_VERSIONS = 20
LOCKS_PREFIX = b"__raftkv/locks/"  # kvserver.spark.lock.DEFAULT_PREFIX
COMMITLOG_PREFIX = b"__raftkv/commitlog/"  # kvserver.spark.commitlog.DEFAULT_PREFIX
BATCHES_PREFIX = b"__raftkv/batches/"  # kvserver.spark.exactly_once.DEFAULT_PREFIX
_KV_ROUTE_SUFFIXES = ("/kv/range", "/kv/put", "/kv/deleterange", "/kv/txn")
_REST_KV_ROUTE = "/v1/kv/{key}"


def _answer(obj: Any, status: int = 200) -> web.Response:
    return json_response(dumps(obj).encode("ascii"), status)


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(raw: Any, name: str) -> bytes:
    if type(raw) is not str:
        raise _invalid(f"{name}: expected base64 text")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(f"{name}: bad base64") from None


# --- who is asking ----------------------------------------------------------------------------


def _auth_enabled(request: web.Request) -> bool:
    auth = http_auth.auth_service(request)
    return auth is not None and bool(auth.enabled)


def ui_user(request: web.Request) -> str | None:
    """The user of a data request: None without auth; with auth, the token's user (a request
    without a token is refused, as the gateway refuses it)."""
    if not _auth_enabled(request):
        return None
    user = http_auth.user_of(request)
    if user is None:
        raise auth_errors.UserEmptyError()
    return user


def _can_read(request: web.Request, user: str | None, key: bytes, end: bytes = b"") -> bool:
    auth = http_auth.auth_service(request)
    return auth is None or bool(auth.can_read(user, key, end))


# --- cluster ------------------------------------------------------------------------------------


def _node_stats(request: web.Request) -> dict[str, Any]:
    source = request.app[METRICS_KEY].node_stats
    try:
        return dict(source()) if source is not None else {}
    except Exception:  # the stats are best effort here, as on a scrape
        return {}


def _progress(service: Any) -> tuple[str, dict[str, Any]]:
    """(role, the leader's view of every member's log) from the raft node, when there is one."""
    node = getattr(service, "node", None)
    if node is None:
        return "unknown", {}
    role = str(node.status().get("role", "unknown"))
    raw = getattr(node, "raw", None)
    progress: dict[str, Any] = {}
    if raw is not None and getattr(node, "is_leader", False):
        for member_id, pr in raw.status().progress.items():
            progress[format(member_id, "x")] = {
                "match": pr.match,
                "next": pr.next,
                "state": str(pr.state),
                "recent_active": pr.recent_active,
            }
    return role, progress


def local_view(request: web.Request) -> dict[str, Any]:
    service = request.app[SERVICE_KEY]
    status = service.status()
    stats = _node_stats(request)
    role, progress = _progress(service)
    if role.startswith("StateType."):
        role = role[len("StateType.") :]
    role = role.removeprefix("State").lower() or "unknown"
    return {
        **ops.status_json(status),
        "role": role,
        "reachable": True,
        "leader_changes": int(stats.get("raft_leader_changes", 0)),
        "pending_proposals": int(stats.get("proposals_pending", 0)),
        "quota_backend_bytes": status.quota_backend_bytes
        or int(stats.get("quota_backend_bytes", 0)),
        "alarms": list(status.errors),
        "progress": progress,
    }


async def config(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    status = service.status()
    return _answer(
        {
            "write": ui_config(request).write,
            "auth_enabled": _auth_enabled(request),
            "member": {"id": format(status.member_id, "x"), "name": status.name},
            "version": status.version,
        }
    )


async def local(request: web.Request) -> web.Response:
    return _answer(local_view(request))


def _session(request: web.Request) -> aiohttp.ClientSession:
    ssl_context = request.app.get(forward.FORWARD_SSL_KEY)
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S),
        connector=aiohttp.TCPConnector(ssl=True if ssl_context is None else ssl_context),
    )


async def _get_json(session: aiohttp.ClientSession, base: str, path: str) -> Any:
    """Another member's answer, or None when it does not give one in time."""
    try:
        async with session.get(base.rstrip("/") + path) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _fetch_local(session: aiohttp.ClientSession, member: dict[str, Any]) -> dict[str, Any]:
    urls = member.get("client_urls") or []
    base = {**member, "reachable": False, "role": "unknown", "progress": {}}
    if not urls:
        return {**base, "error": "no client URL published yet"}
    view = await _get_json(session, urls[0], API + "/local")
    if view is None:
        return {**base, "error": f"no answer from {urls[0]} within {PEER_TIMEOUT_S} s"}
    return {**base, **view, "reachable": True}


async def cluster(request: web.Request) -> web.Response:
    mine = local_view(request)
    others = [m for m in mine["members"] if m["id"] != mine["id"]]
    async with _session(request) as session:
        fetched = await asyncio.gather(*(_fetch_local(session, m) for m in others))
    views = {mine["id"]: mine, **{v["id"]: v for v in fetched}}
    # The leader as the reachable members see it (the highest term wins).
    leader_view = max(
        (v for v in views.values() if v.get("reachable") and v.get("leader")),
        key=lambda v: v.get("term", 0),
        default=None,
    )
    leader = leader_view["leader"] if leader_view else None
    progress = views.get(leader, {}).get("progress", {}) if leader else {}
    leader_commit = views.get(leader, {}).get("commit_index", 0) if leader else 0
    members = []
    for m in mine["members"]:
        view = dict(views.get(m["id"], m))
        view.pop("members", None)
        pr = progress.get(m["id"])
        view["match"] = pr["match"] if pr else None
        view["lag"] = max(0, leader_commit - pr["match"]) if pr else None
        view["is_leader"] = m["id"] == leader
        members.append(view)
    return _answer(
        {
            "leader": leader,
            "term": leader_view.get("term") if leader_view else mine["term"],
            "served_by": mine["id"],
            "members": members,
        }
    )


# --- metrics ------------------------------------------------------------------------------------


def _histogram_sums(metrics: Any) -> tuple[list[str], list[float], float, float]:
    """(bucket bounds, cumulative counts summed over the key-value routes, reads, writes)."""
    bounds: list[str] = []
    counts: dict[str, float] = {}
    reads = writes = 0.0
    for family in metrics.registry.collect():
        if family.name != "raftkv_http_request_duration_seconds":
            continue
        for sample in family.samples:
            route = sample.labels.get("route", "")
            is_kv = route.endswith(_KV_ROUTE_SUFFIXES) or route == _REST_KV_ROUTE
            if not is_kv:
                continue
            if sample.name.endswith("_bucket"):
                le = sample.labels["le"]
                if le not in counts:
                    bounds.append(le)
                    counts[le] = 0.0
                counts[le] += sample.value
            elif sample.name.endswith("_count"):
                if route.endswith("/kv/range"):
                    reads += sample.value
                else:
                    writes += sample.value
    bounds.sort(key=lambda b: float("inf") if b == "+Inf" else float(b))
    return bounds, [counts[b] for b in bounds], reads, writes


def local_metrics(request: web.Request) -> dict[str, Any]:
    stats = _node_stats(request)
    bounds, counts, reads, writes = _histogram_sums(request.app[METRICS_KEY])
    fsync: dict[str, Any] = {"le": [], "counts": []}
    hist = stats.get("wal_fsync_duration_seconds")
    if hist is not None and hasattr(hist, "snapshot"):
        buckets, _ = hist.snapshot()
        fsync = {"le": [b for b, _ in buckets], "counts": [n for _, n in buckets]}
    return {
        "t": round(time.time(), 3),
        "members": [format(request.app[SERVICE_KEY].member_id, "x")],
        "revision": int(stats.get("store_revision", 0)),
        "proposals_committed": int(stats.get("proposals_committed", 0)),
        "proposals_failed": int(stats.get("proposals_failed", 0)),
        "proposals_pending": int(stats.get("proposals_pending", 0)),
        "leader_changes": int(stats.get("raft_leader_changes", 0)),
        "reads": int(reads),
        "writes": int(writes),
        "latency": {"le": bounds, "counts": [int(c) for c in counts]},
        "fsync": fsync,
    }


def _le_key(le: str) -> float:
    return float("inf") if le == "+Inf" else float(le)


def _merge_histograms(hists: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, int] = {}
    for h in hists:
        for le, n in zip(h["le"], h["counts"], strict=False):
            total[le] = total.get(le, 0) + int(n)
    les = sorted(total, key=_le_key)
    return {"le": les, "counts": [total[le] for le in les]}


def merge_metrics(views: list[dict[str, Any]]) -> dict[str, Any]:
    """The cluster's numbers from its members': counters and histograms summed (requests
    and fsyncs of every member), the revision and leader changes the highest seen."""
    out = dict(views[0])
    out["members"] = sorted(m for v in views for m in v["members"])
    for field in ("proposals_committed", "proposals_failed", "proposals_pending", "reads"):
        out[field] = sum(int(v[field]) for v in views)
    out["writes"] = sum(int(v["writes"]) for v in views)
    out["revision"] = max(int(v["revision"]) for v in views)
    out["leader_changes"] = max(int(v["leader_changes"]) for v in views)
    out["latency"] = _merge_histograms([v["latency"] for v in views])
    out["fsync"] = _merge_histograms([v["fsync"] for v in views])
    return out


async def metrics_summary(request: web.Request) -> web.Response:
    mine = local_metrics(request)
    if request.query.get("scope") != "cluster":
        return _answer(mine)
    status = request.app[SERVICE_KEY].status()
    urls = [m.client_urls[0] for m in status.members if m.id != status.member_id and m.client_urls]
    async with _session(request) as session:
        fetched = await asyncio.gather(*(_get_json(session, u, API + "/metrics") for u in urls))
    return _answer(merge_metrics([mine, *(v for v in fetched if v is not None)]))


# --- archive ------------------------------------------------------------------------------------


def _time_at(timeline: list[list[float]], index: int) -> float | None:
    """When the archive first held commit index ``index`` (timeline: [unix, commit])."""
    for when, commit in timeline:
        if commit >= index:
            return when
    return None


def archive_view(archiver: Any) -> dict[str, Any]:
    if archiver is None:
        return {"enabled": False}
    entries, seconds = archiver.lag()
    out: dict[str, Any] = {
        "enabled": True,
        "lag_entries": entries,
        "lag_seconds": round(seconds, 3),
        "errors": archiver.stats.get("errors", 0),
        "uploaded_bytes": archiver.stats.get("uploaded_bytes", 0),
        "last_error": archiver.last_error,
    }
    m = archiver.manifest
    if m is None:
        return {**out, "opened": False}
    snaps = list(m.snapshots)
    timeline = [list(p) for p in m.timeline]
    first = snaps[0] if snaps else None
    return {
        **out,
        "opened": True,
        "last_upload_unix": m.updated_unix or None,
        "snapshots": len(snaps),
        "segments": len(m.segments),
        "restorable": {
            "from_index": first.index if first else None,
            "from_revision": first.revision if first else None,
            "from_unix": _time_at(timeline, first.index) if first else None,
            "to_index": m.commit,
            "to_unix": timeline[-1][0] if timeline else None,
        },
    }


async def archive(request: web.Request) -> web.Response:
    return _answer(archive_view(ui_config(request).archiver))


# --- a key's history ------------------------------------------------------------------------------


def _version_json(kv: KeyValue, deleted: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "DELETE" if deleted else "PUT",
        "mod_revision": kv.mod_revision,
    }
    if not deleted:
        out.update(
            create_revision=kv.create_revision,
            version=kv.version,
            lease=format(kv.lease, "x") if kv.lease else "",
            value=_b64(kv.value),
        )
    return out


async def key_history(store: Any, key: bytes) -> tuple[list[dict[str, Any]], bool, int]:
    """(versions oldest first, truncated, compact revision): the key's puts and deletes from
    the compact revision on, read from the store's change log a slice per loop turn."""
    versions: deque[dict[str, Any]] = deque(maxlen=MAX_VERSIONS)
    seen = 0
    compact = store.compact_revision
    start = max(compact, 1)
    while True:
        events, next_rev = store.replay(start, key, max_scanned=HISTORY_SCAN_RECORDS)
        for ev in events:
            deleted = ev.kv.create_revision == 0
            versions.append(_version_json(ev.kv, deleted))
            seen += 1
        if next_rev > store.revision:
            break
        start = next_rev
        await asyncio.sleep(0)  # one slice per loop turn
    return list(versions), seen > len(versions), compact


async def history(request: web.Request) -> web.Response:
    user = ui_user(request)
    key = _unb64(request.query.get("key"), "key")
    if not key:
        raise _invalid("key: must not be empty")
    if not _can_read(request, user, key):
        raise auth_errors.PermissionDeniedError()
    service = request.app[SERVICE_KEY]
    store = getattr(service, "store", None)
    if store is None:
        raise ServiceError(GrpcCode.UNIMPLEMENTED, "raftkv: this member keeps no history")
    # A linearizable read of the key first (a ReadIndex round): the history is then no older
    # than what the gateway would answer at this moment, on a follower too.
    await service.range(RangeRequest(key=key, limit=1, keys_only=True))
    versions, truncated, compact = await key_history(store, key)
    return _answer(
        {
            "key": _b64(key),
            "revision": store.revision,
            "compact_revision": compact,
            "versions": versions,
            "truncated": truncated,
        }
    )


# --- pipelines -------------------------------------------------------------------------------------


async def _scan(service: Any, prefix: bytes) -> tuple[tuple[KeyValue, ...], bool]:
    resp = await service.range(
        RangeRequest(
            key=prefix,
            range_end=prefix_range_end(prefix),
            limit=PIPELINE_SCAN_KEYS,
        )
    )
    return resp.kvs, resp.more


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def locks_view(kvs: tuple[KeyValue, ...]) -> list[dict[str, Any]]:
    by_name: dict[str, list[KeyValue]] = {}
    for kv in kvs:
        rest = kv.key[len(LOCKS_PREFIX) :]
        raw_name, sep, _lease = rest.rpartition(b"/")
        if not sep:
            continue
        by_name.setdefault(_text(raw_name), []).append(kv)
    out = []
    for name, queue in sorted(by_name.items()):
        queue.sort(key=lambda kv: kv.create_revision)
        holder = queue[0]
        out.append(
            {
                "name": name,
                "holder": _text(holder.key),
                "token": holder.create_revision,
                "lease": format(holder.lease, "x") if holder.lease else "",
                "holder_value": _text(holder.value)[:200],
                "waiters": [
                    {"key": _text(kv.key), "create_revision": kv.create_revision}
                    for kv in queue[1:]
                ],
            }
        )
    return out


_COMMIT_FIELDS = {  # where a payload written by other tools may say the same
    "committer": ("committer", "writer", "owner", "app_id", "query"),
    "time": ("time", "committed_at", "timestamp", "ts"),
    "fence": ("fence", "token", "fencing_token"),
}


def _commit_record(info: Any) -> dict[str, Any]:
    """The fields of a commit's record (``<table>/m/<N>``, kvserver.spark.commitlog)."""
    if not isinstance(info, dict):
        return {}
    row: dict[str, Any] = {}
    if info.get("committer") is not None:
        row["committer"] = info["committer"]
    if info.get("committed_at") is not None:
        row["time"] = info["committed_at"]
    fence = info.get("fence")
    if isinstance(fence, dict) and "token" in fence:
        row["fence"] = f"{fence['token']} ({fence.get('key', '')})"
    return row


def commitlogs_view(kvs: tuple[KeyValue, ...]) -> list[dict[str, Any]]:
    tables: dict[str, list[KeyValue]] = {}
    records: dict[tuple[str, bytes], Any] = {}
    for kv in kvs:
        rest = kv.key[len(COMMITLOG_PREFIX) :]
        raw_table, sep, digits = rest.rpartition(b"/v/")
        if sep and digits.isdigit():
            tables.setdefault(_text(raw_table), []).append(kv)
            continue
        raw_table, sep, digits = rest.rpartition(b"/m/")
        if sep and digits.isdigit():
            records[(_text(raw_table), digits)] = _json_or_none(kv.value)
    out = []
    for table, entries in sorted(tables.items()):
        newest = entries[-TABLE_VERSIONS:][::-1]
        rows = []
        for kv in newest:
            digits = kv.key.rpartition(b"/v/")[2]
            payload = _json_or_none(kv.value)
            row: dict[str, Any] = {
                "version": int(digits),
                "revision": kv.mod_revision,
                "payload": _text(kv.value)[:300],
            }
            if isinstance(payload, dict):
                for field, names in _COMMIT_FIELDS.items():
                    for n in names:
                        if n in payload:
                            row[field] = payload[n]
                            break
            row.update(_commit_record(records.get((table, digits))))
            rows.append(row)
        out.append({"table": table, "versions_seen": len(entries), "latest": rows})
    return out


def batches_view(kvs: tuple[KeyValue, ...]) -> list[dict[str, Any]]:
    names: dict[str, list[KeyValue]] = {}
    for kv in kvs:
        rest = kv.key[len(BATCHES_PREFIX) :]
        raw_name, sep, digits = rest.rpartition(b"/")
        if not sep or not digits.isdigit():
            continue
        names.setdefault(_text(raw_name), []).append(kv)
    out = []
    for name, markers in sorted(names.items()):
        last = markers[-1]
        payload = _json_or_none(last.value)
        finished = payload.get("finished_at") if isinstance(payload, dict) else None
        out.append(
            {
                "name": name,
                "batches": len(markers),
                "last_batch_id": int(last.key.rpartition(b"/")[2]),
                "last_finished_unix": finished,
                "revision": last.mod_revision,
            }
        )
    return out


async def pipelines(request: web.Request) -> web.Response:
    user = ui_user(request)
    service = request.app[SERVICE_KEY]
    out: dict[str, Any] = {}
    for section, prefix, render in (
        ("locks", LOCKS_PREFIX, locks_view),
        ("commitlogs", COMMITLOG_PREFIX, commitlogs_view),
        ("batches", BATCHES_PREFIX, batches_view),
    ):
        if not _can_read(request, user, prefix, prefix_range_end(prefix)):
            out[section] = {"denied": True, "prefix": _text(prefix)}
            continue
        kvs, more = await _scan(service, prefix)
        out[section] = {"prefix": _text(prefix), "items": render(kvs), "truncated": more}
    return _answer(out)


# --- write actions (--ui-write) ---------------------------------------------------------------------


def _object_from(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body or b"{}")
    except ValueError:
        raise _invalid("body: bad JSON") from None
    if type(obj) is not dict:
        raise _invalid("body: expected a JSON object")
    return obj


def _check_writable(request: web.Request) -> None:
    if not ui_config(request).write:
        raise ServiceError(
            GrpcCode.PERMISSION_DENIED,
            "raftkv: the dashboard is read-only on this member (start it with --ui-write)",
        )


async def _object(request: web.Request) -> dict[str, Any]:
    return _object_from(await read_body(request, request.app[LIMITS_KEY].max_body_bytes))


async def kv_put(request: web.Request) -> web.Response:
    _check_writable(request)
    user = ui_user(request)
    obj = await _object(request)
    req = PutRequest(key=_unb64(obj.get("key"), "key"), value=_unb64(obj.get("value", ""), "value"))
    if not req.key:
        raise _invalid("key: must not be empty")
    auth = http_auth.auth_service(request)
    if auth is not None:
        auth.check_request(user, req)
    resp = await request.app[SERVICE_KEY].put(req)
    return _answer({"revision": resp.header.revision})


async def kv_delete(request: web.Request) -> web.Response:
    _check_writable(request)
    user = ui_user(request)
    obj = await _object(request)
    req = DeleteRangeRequest(key=_unb64(obj.get("key"), "key"))
    if not req.key:
        raise _invalid("key: must not be empty")
    auth = http_auth.auth_service(request)
    if auth is not None:
        auth.check_request(user, req)
    resp = await request.app[SERVICE_KEY].delete_range(req)
    return _answer({"revision": resp.header.revision, "deleted": resp.deleted})


async def move_leader(request: web.Request) -> web.Response:
    _check_writable(request)
    user = ui_user(request)
    auth = http_auth.auth_service(request)
    if auth is not None:
        auth.check_admin(user)
    body = await read_body(request, request.app[LIMITS_KEY].max_body_bytes)
    obj = _object_from(body)
    raw = obj.get("to")
    try:
        target = int(raw, 16) if type(raw) is str else -1
    except ValueError:
        target = -1
    if target <= 0:
        raise _invalid("to: expected a member id in hex")
    service = request.app[SERVICE_KEY]
    try:
        await service.move_leader(target)
    except ServiceError as exc:
        if not forward.forwardable(request, exc):
            raise
        return await forward.to_leader(request, body, exc)
    return _answer({"leader": format(target, "x")})


ROUTES = (
    ("GET", API + "/config", config),
    ("GET", API + "/local", local),
    ("GET", API + "/cluster", cluster),
    ("GET", API + "/metrics", metrics_summary),
    ("GET", API + "/archive", archive),
    ("GET", API + "/history", history),
    ("GET", API + "/pipelines", pipelines),
    ("POST", API + "/kv/put", kv_put),
    ("POST", API + "/kv/delete", kv_delete),
    ("POST", API + "/move-leader", move_leader),
)
