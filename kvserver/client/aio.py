"""The asyncio client: the key-value, watch, lease, cluster and auth calls of etcd's v3 API.

Wire protocol: etcd's v3 JSON gateway (``kvserver.client.codec``), so the client works against
raftkv and against a real etcd (3.4+). Writes additionally carry ``X-Raftkv-Client-Id`` and
``X-Raftkv-Request-Id`` (decimal uint64): the client id is random per client object, the request
id increases per call, and every retry of a call re-sends the same pair, so a raftkv server
applies a retried write once. (etcd ignores the headers: against etcd a write retried after an
ambiguous failure — a timeout or a dropped connection — may be applied twice.)

Routing, retries and auth are ``kvserver.client.retry``'s: writes and linearizable reads go
to the leader when it is known; serializable reads, status and member calls stay on the
endpoint that last answered. One call has an overall deadline (``timeout_s``); each HTTP
attempt is bounded by ``attempt_timeout_s`` (connecting by ``connect_timeout_s``), and at most
``retries`` attempts follow the first. Only ``retryable`` failures are retried — no
connection, a broken connection, no answer in time, HTTP 503 (no leader, leader changed,
request timed out) or 502/504 — failing over to another endpoint at once and backing off
(``backoff_initial_s`` to ``backoff_max_s``) when every endpoint has failed. Anything else
(400 invalid argument, compacted revision, 404, ...) ends the call on the first answer. With
``user`` and ``password`` the client authenticates (``/v3/auth/authenticate``) on the first
call that needs it; without ``user`` no ``Authorization`` header is sent.

TLS: ``https://`` endpoints are verified with ``ca_file`` (else the system CAs), and
``cert_file``/``key_file`` are presented as a client certificate (etcdctl's ``--cacert --cert
--key``); or pass a ready ``ssl_context``. A refused handshake is a ``ConnectionFailedError``
saying "TLS handshake failed".

One ``aiohttp.ClientSession`` (keep-alive connections, at most ``max_connections``;
``kvserver.client.transport``) is created on first use; an ``AsyncClient`` belongs to the
event loop that first used it. Close it with ``await client.close()`` or ``async with
AsyncClient(...) as client``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import ssl
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvserver.client import alarms, codec, columnar, leases, members
from kvserver.client.errors import (
    ClientError,
    CompactedError,
    NotFoundError,
    UnimplementedError,
)
from kvserver.client.retry import RetryEngine, Route, normalize_endpoints
from kvserver.client.transport import HttpTransport
from kvserver.client.txn import KeyLike, Txn, as_bytes, key_range, range_request
from kvserver.client.types import (
    CompactResult,
    DeleteResult,
    EndpointStatus,
    KeyValue,
    Lease,
    LeaseList,
    LeaseRevokeResult,
    LeaseTimeToLive,
    Member,
    PutResult,
    RangeResult,
    Status,
    TxnResult,
)
from kvserver.client.watch import DEFAULT_RECONNECT_TIMEOUT_S, AsyncWatch
from kvserver.kvpb.alarm import AlarmAction, AlarmType
from kvserver.kvpb.headers import CLIENT_ID_HEADER, REQUEST_ID_HEADER
from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    ResponseHeader,
    SortOrder,
    SortTarget,
    TxnRequest,
)
from kvserver.tls import client_context

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a range answer can be big, but not unbounded
MAX_RETRIES = 1000
UINT64_MAX = (1 << 64) - 1

T = TypeVar("T")


def _show_key(key: KeyLike) -> str:
    text = key if isinstance(key, str) else as_bytes(key).decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


class AsyncClient:
    """asyncio client for raftkv (and etcd's JSON gateway). See the module docstring."""

    def __init__(
        self,
        endpoints: str | Sequence[str] = DEFAULT_ENDPOINT,
        *,
        timeout_s: float = 5.0,
        attempt_timeout_s: float = 2.0,
        connect_timeout_s: float = 1.0,
        retries: int = 10,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        prefer_leader: bool = True,
        client_id: int | None = None,
        max_connections: int = 64,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        rng: random.Random | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        endpoints = normalize_endpoints(endpoints)
        if password is not None and not user:
            raise ValueError("password given without user")
        if user and password is None:
            raise ValueError(f"user {user!r} given without password")
        # https endpoints: ssl_context as given, else one built from the files (etcdctl's
        # --cacert/--cert/--key; no ca_file: the system CAs). Loaded now: a bad file fails here.
        if ssl_context is not None and (ca_file or cert_file or key_file):
            raise ValueError("give ssl_context or ca_file/cert_file/key_file, not both")
        if ssl_context is None and (ca_file or cert_file or key_file):
            ssl_context = client_context(ca_file, cert_file, key_file)
        for name, value in (
            ("timeout_s", timeout_s),
            ("attempt_timeout_s", attempt_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if not 0 <= retries <= MAX_RETRIES:
            raise ValueError(f"retries must be in [0, {MAX_RETRIES}], got {retries!r}")
        if not 0 < max_response_bytes <= 1 << 32:
            raise ValueError(
                f"max_response_bytes must be in (0, 4 GiB], got {max_response_bytes!r}"
            )
        if not 1 <= max_connections <= 10_000:
            raise ValueError(f"max_connections must be in [1, 10000], got {max_connections!r}")
        if client_id is None:
            client_id = random.SystemRandom().getrandbits(64) or 1
        if not 0 < client_id <= UINT64_MAX:
            raise ValueError(f"client_id must be a non-zero uint64, got {client_id!r}")
        self._client_id = client_id
        self._request_ids = itertools.count(1)
        self._transport = HttpTransport(
            ssl_context=True if ssl_context is None else ssl_context,
            connect_timeout_s=float(connect_timeout_s),
            max_connections=max_connections,
            max_response_bytes=max_response_bytes,
        )
        self._retry = RetryEngine(
            endpoints,
            self._transport,
            timeout_s=float(timeout_s),
            attempt_timeout_s=float(attempt_timeout_s),
            retries=retries,
            backoff_initial_s=float(backoff_initial_s),
            backoff_max_s=max(float(backoff_max_s), float(backoff_initial_s)),
            prefer_leader=prefer_leader,
            rng=rng or random.Random(),
            user=user or None,
            password=password,
        )

    # -----------------------------------------------------------------------------------------
    # Properties and lifecycle

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._retry.endpoints

    @property
    def client_id(self) -> int:
        return self._client_id

    @property
    def timeout_s(self) -> float:
        return self._retry.timeout_s

    @property
    def leader_endpoint(self) -> str | None:
        """The leader's endpoint as last discovered (``None`` when unknown)."""
        return self._retry.leader

    @property
    def user(self) -> str | None:
        return self._retry.user

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncClient(endpoints={list(self.endpoints)!r}, "
            f"timeout_s={self.timeout_s}, leader={self.leader_endpoint!r})"
        )

    # -----------------------------------------------------------------------------------------
    # Key-value API

    async def put(
        self, key: KeyLike, value: KeyLike, *, lease: int = 0, prev_kv: bool = False
    ) -> PutResult:
        """Set ``key`` to ``value`` (optionally attached to ``lease``); with ``prev_kv`` the
        result carries the key's previous version."""
        req = PutRequest(
            key=as_bytes(key), value=as_bytes(value, "value"), lease=lease, prev_kv=prev_kv
        )
        return await self._call(
            f"put {_show_key(key)}",
            "POST",
            "/v3/kv/put",
            codec.encode_put(req),
            _plain(codec.decode_put),
            Route.LEADER,
            write=True,
        )

    async def get(
        self, key: KeyLike, *, revision: int = 0, serializable: bool = False
    ) -> KeyValue | None:
        """The current (or ``revision``'s) version of ``key``, or ``None``. Use ``range`` for
        the response revision, prefixes and options."""
        result = await self.range(key, revision=revision, serializable=serializable)
        return result.first()

    async def range(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        serializable: bool = False,
        keys_only: bool = False,
        count_only: bool = False,
        sort_order: SortOrder | str = SortOrder.NONE,
        sort_target: SortTarget | str = SortTarget.KEY,
    ) -> RangeResult:
        """Keys in ``[key, range_end)`` (``range_end=b"\\0"``: every key >= ``key``), or with
        ``prefix`` every key starting with ``key``, or just ``key``. Linearizable unless
        ``serializable`` (then any node answers from its local, possibly stale, state)."""
        req = range_request(
            key,
            range_end=range_end,
            prefix=prefix,
            limit=limit,
            revision=revision,
            serializable=serializable,
            keys_only=keys_only,
            count_only=count_only,
            sort_order=sort_order,
            sort_target=sort_target,
        )
        what = f"get {_show_key(key)}" + (" --prefix" if prefix else "")
        return await self._call(
            what,
            "POST",
            "/v3/kv/range",
            codec.encode_range(req),
            _plain(codec.decode_range),
            Route.ANY if serializable else Route.LEADER,
        )

    async def range_arrow(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        serializable: bool = False,
        value_format: str = "binary",
        key_format: str = "string",
    ) -> columnar.ArrowRange:
        """``range`` with the kvs as one ``pyarrow.RecordBatch``, decoded column by column
        (``kvserver.client.columnar``; needs pyarrow and numpy)."""
        return await columnar.range_arrow(
            self._retry,
            key,
            range_end,
            prefix=prefix,
            limit=limit,
            revision=revision,
            serializable=serializable,
            value_format=value_format,
            key_format=key_format,
        )

    async def key_ranks(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        ranks: Sequence[int],
        prefix: bool = False,
        revision: int = 0,
        serializable: bool = False,
    ) -> columnar.KeyRanks:
        """raftkv only (``POST /v1/ranks``): the live keys at 0-based ``ranks`` of the range
        and its key count, O(log N) per rank on the server (``kvserver.client.columnar``)."""
        return await columnar.key_ranks(
            self._retry,
            key,
            range_end,
            ranks=ranks,
            prefix=prefix,
            revision=revision,
            serializable=serializable,
        )

    async def delete(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        prev_kv: bool = False,
    ) -> DeleteResult:
        """Delete ``key`` (or the range / prefix); ``deleted`` counts the keys removed."""
        k, end = key_range(key, range_end, prefix)
        req = DeleteRangeRequest(key=k, range_end=end, prev_kv=prev_kv)
        what = f"delete {_show_key(key)}" + (" --prefix" if prefix else "")
        return await self._call(
            what,
            "POST",
            "/v3/kv/deleterange",
            codec.encode_delete(req),
            _plain(codec.decode_delete),
            Route.LEADER,
            write=True,
        )

    async def txn(self, txn: Txn | TxnRequest) -> TxnResult:
        """Run a transaction (see ``kvserver.client.txn``) atomically."""
        req = txn.to_request() if isinstance(txn, Txn) else txn
        return await self._call(
            "txn",
            "POST",
            "/v3/kv/txn",
            codec.encode_txn(req),
            _plain(codec.decode_txn),
            Route.LEADER,
            write=True,
        )

    async def compact(self, revision: int, *, physical: bool = False) -> CompactResult:
        """Drop the history below ``revision``.

        If an attempt failed ambiguously (e.g. timed out) and a retry is told the revision is
        already compacted, the compaction did happen: the call succeeds, with a result whose
        ``revision`` is 0 because no server answered it directly."""
        if revision <= 0:
            raise ValueError(f"revision must be > 0, got {revision}")
        req = CompactionRequest(revision=revision, physical=physical)
        try:
            return await self._call(
                f"compact {revision}",
                "POST",
                "/v3/kv/compaction",
                codec.encode_compaction(req),
                _plain(codec.decode_compaction),
                Route.LEADER,
                write=True,
            )
        except CompactedError as err:
            if len(err.attempts) > 1:
                return CompactResult(header=ResponseHeader())
            raise

    def watch(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
        filters: Sequence[str] = (),
        progress_notify: bool = False,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
    ) -> AsyncWatch:
        """Every change to ``key`` (or the range / prefix) from ``start_revision`` (0: from
        now on), as an async iterator of ``WatchEvent``s in revision order, each once, across
        reconnects to other endpoints (see ``kvserver.client.watch``). ``filters``: ``"NOPUT"``
        and/or ``"NODELETE"``. Raises ``WatchCompactedError`` when the history it needs is
        compacted. ``async with`` (or ``await w.start()``) waits until the server created the
        watcher (the blocking ``Client.watch`` returns only then); closing ends the watch."""
        return AsyncWatch(
            self._retry,
            key,
            range_end,
            prefix=prefix,
            start_revision=start_revision,
            prev_kv=prev_kv,
            filters=filters,
            progress_notify=progress_notify,
            reconnect_timeout_s=reconnect_timeout_s,
        )

    # -----------------------------------------------------------------------------------------
    # Lease API (the JSON and the keep-alive task are in ``kvserver.client.leases``)

    async def lease_grant(self, ttl_s: int, lease_id: int = 0) -> Lease:
        """Grant a lease of ``ttl_s`` seconds (ID ``lease_id``, or one the server chooses when
        0). Raises ``LeaseExistsError`` when that ID is taken."""
        return await self._call(
            f"lease grant {ttl_s}",
            "POST",
            leases.GRANT_PATH,
            leases.encode_grant(ttl_s, lease_id),
            _plain(leases.decode_grant),
            Route.LEADER,
            write=True,
        )

    async def lease_revoke(self, lease_id: int) -> LeaseRevokeResult:
        """Revoke a lease, deleting its keys. Raises ``LeaseNotFoundError`` (also when a retry
        after an ambiguous failure finds the first attempt already revoked it)."""
        return await self._call(
            f"lease revoke {leases.format_lease_id(lease_id)}",
            "POST",
            leases.REVOKE_PATH,
            leases.encode_id(lease_id),
            _plain(leases.decode_revoke),
            Route.LEADER,
            write=True,
        )

    async def lease_keepalive_once(self, lease_id: int) -> int:
        """Refresh a lease once; the TTL (s) it has again. Raises ``LeaseNotFoundError``."""
        return await self._call(
            f"lease keep-alive {leases.format_lease_id(lease_id)}",
            "POST",
            leases.KEEPALIVE_PATH,
            leases.encode_id(lease_id),
            lambda doc, _: leases.decode_keepalive(doc, lease_id),
            Route.LEADER,
        )

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLive:
        """A lease's remaining and granted TTL (and its keys with ``keys``); ``ttl_s == -1``
        (``.expired``) when there is no such lease."""
        return await self._call(
            f"lease timetolive {leases.format_lease_id(lease_id)}",
            "POST",
            leases.TIME_TO_LIVE_PATH,
            leases.encode_time_to_live(lease_id, keys),
            _plain(leases.decode_time_to_live),
            Route.LEADER,
        )

    async def lease_leases(self) -> LeaseList:
        """The IDs of every lease."""
        return await self._call(
            "lease list", "POST", leases.LEASES_PATH, {}, _plain(leases.decode_leases), Route.LEADER
        )

    def keep_alive(
        self,
        lease_id: int,
        *,
        interval_s: float | None = None,
        on_refresh: Callable[[int], Any] | None = None,
    ) -> leases.KeepAlive:
        """Keep a lease alive from a background task until closed: ``async with
        client.keep_alive(lease.id) as ka: ...`` (or ``await ka.start()`` / ``await
        ka.close()``). Refreshes at once, then every ``interval_s`` (default TTL/3), failing
        over between endpoints; see ``kvserver.client.leases``."""
        return leases.KeepAlive(self, lease_id, interval_s=interval_s, on_refresh=on_refresh)

    # -----------------------------------------------------------------------------------------
    # Cluster API

    async def status(self, endpoint: str | None = None) -> Status:
        """``/v3/maintenance/status`` of ``endpoint`` (only that one, with retries), or of any
        endpoint that answers."""
        if endpoint is None:
            return await self._call(
                "status", "POST", "/v3/maintenance/status", {}, codec.decode_status, Route.ANY
            )
        pinned = normalize_endpoints([endpoint])[0]
        return await self._call(
            f"status of {pinned}",
            "POST",
            "/v3/maintenance/status",
            {},
            codec.decode_status,
            Route.ANY,
            pinned=pinned,
        )

    async def statuses(self) -> tuple[EndpointStatus, ...]:
        """The status of every configured endpoint, asked at once, one attempt each (bounded by
        ``attempt_timeout_s`` and ``timeout_s``); a failure is reported, not raised."""

        async def one(endpoint: str) -> EndpointStatus:
            try:
                status = await self._call(
                    f"status of {endpoint}",
                    "POST",
                    "/v3/maintenance/status",
                    {},
                    codec.decode_status,
                    Route.ANY,
                    pinned=endpoint,
                    max_attempts=1,
                )
            except ClientError as err:
                return EndpointStatus(endpoint=endpoint, status=None, error=err)
            return EndpointStatus(endpoint=endpoint, status=status, error=None)

        return tuple(await asyncio.gather(*(one(ep) for ep in self.endpoints)))

    async def member_list(self) -> tuple[Member, ...]:
        """The cluster's members (``/v3/cluster/member/list``; raftkv's ``/v1/status`` where
        the former is not served: 404/501)."""
        try:
            return await self._call(
                "member list", "POST", "/v3/cluster/member/list", {}, _decode_members, Route.ANY
            )
        except (NotFoundError, UnimplementedError):
            return await self._call(
                "member list", "GET", "/v1/status", None, _decode_members, Route.ANY
            )

    async def member_add(
        self, peer_urls: Sequence[str], *, is_learner: bool = False
    ) -> members.MemberAddResult:
        """Add a member (a learner with ``is_learner``) with these peer URLs; the result has
        the new member's ID. Then start it with ``--initial-cluster-state existing``."""
        return await self._call(
            "member add",
            "POST",
            members.ADD_PATH,
            members.encode_add(peer_urls, is_learner),
            _plain(members.decode_add),
            Route.LEADER,
        )

    async def member_remove(self, member_id: int) -> members.MemberChangeResult:
        """Remove a member for good (it stops serving)."""
        return await self._call(
            f"member remove {member_id:x}",
            "POST",
            members.REMOVE_PATH,
            members.encode_id(member_id),
            _plain(members.decode_change),
            Route.LEADER,
        )

    async def member_promote(self, member_id: int) -> members.MemberChangeResult:
        """Make a learner a voter (refused until it has caught up with the leader)."""
        return await self._call(
            f"member promote {member_id:x}",
            "POST",
            members.PROMOTE_PATH,
            members.encode_id(member_id),
            _plain(members.decode_change),
            Route.LEADER,
        )

    async def alarm_list(self) -> alarms.AlarmResult:
        """Every raised alarm (``/v3/maintenance/alarm`` GET)."""
        return await self._call(
            "alarm list",
            "POST",
            alarms.PATH,
            alarms.encode_request(AlarmAction.GET),
            _plain(alarms.decode_result),
            Route.LEADER,
        )

    async def alarm_disarm(
        self, member_id: int = 0, alarm: AlarmType = AlarmType.NONE
    ) -> alarms.AlarmResult:
        """Clear the alarm ``alarm`` of ``member_id``; with neither given, every raised alarm
        (listed first, then cleared one by one, as etcd's clientv3). The alarms cleared."""
        if member_id == 0 and alarm == AlarmType.NONE:
            raised = await self.alarm_list()
            cleared: list[alarms.Alarm] = []
            header = raised.header
            for a in raised.alarms:
                result = await self.alarm_disarm(a.member_id, a.alarm)
                cleared.extend(result.alarms)
                header = result.header
            return alarms.AlarmResult(header, tuple(cleared))
        return await self._call(
            f"alarm disarm {AlarmType(alarm).name} of {member_id:x}",
            "POST",
            alarms.PATH,
            alarms.encode_request(AlarmAction.DEACTIVATE, member_id, alarm),
            _plain(alarms.decode_result),
            Route.LEADER,
        )

    async def auth_request(self, op: str, payload: dict[str, Any] | None = None) -> Any:
        """``POST /v3/auth/<op>`` (``enable``, ``user/add``, ...; see ``kvserver.api.http.auth``)
        with this client's credentials; the answer's JSON document. Errors as every call."""
        if not op or not all(part.isalpha() for part in op.split("/")):
            raise ValueError(f"bad auth operation {op!r}")
        return await self._call(
            f"auth {op}",
            "POST",
            "/v3/auth/" + op,
            payload or {},
            _plain(lambda doc: doc),
            Route.LEADER,
        )

    async def auth_headers(self, deadline_s: float | None = None) -> dict[str, str]:
        """The ``Authorization`` header for a request (authenticating first if needed); empty
        without credentials or when the cluster has auth disabled."""
        return await self._retry.auth_headers(deadline_s)

    async def find_leader(self) -> str | None:
        """Discover the leader now (ignoring what is cached); its endpoint, or ``None``."""
        return await self._retry.find_leader()

    # -----------------------------------------------------------------------------------------
    # One call

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
        decode: Callable[[Any, str], T],
        route: Route,
        *,
        write: bool = False,
        pinned: str | None = None,
        max_attempts: int | None = None,
    ) -> T:
        headers: dict[str, str] = {}
        if write:
            # The same pair on every attempt of this call: the server applies the write once.
            headers[CLIENT_ID_HEADER] = str(self._client_id)
            headers[REQUEST_ID_HEADER] = str(next(self._request_ids))
        return await self._retry.request(
            what,
            method,
            path,
            payload,
            decode,
            route,
            headers=headers,
            pinned=pinned,
            max_attempts=max_attempts,
        )


def _plain(decode: Callable[[Any], T]) -> Callable[[Any, str], T]:
    """A decoder that does not need to know which endpoint answered."""
    return lambda doc, endpoint: decode(doc)


_decode_members = _plain(codec.decode_members)

__all__ = ["AsyncClient", "DEFAULT_ENDPOINT"]
