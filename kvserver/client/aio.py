"""The asyncio client: a list of endpoints, leader discovery, failover, retries, timeouts.

Wire protocol: etcd's v3 JSON gateway (``kvserver.client.codec``), so the client works against
raftkv and against a real etcd (3.4+). Writes additionally carry ``X-Raftkv-Client-Id`` and
``X-Raftkv-Request-Id`` (decimal uint64): the client id is random per client object, the request
id increases per call, and every retry of a call re-sends the same pair, so a raftkv server
applies a retried write once. (etcd ignores the headers: against etcd a write retried after an
ambiguous failure — a timeout or a dropped connection — may be applied twice.)

Routing. Writes and linearizable reads go to the leader when it is known (followers would
forward them anyway; sending to the leader saves a hop). The leader is found lazily and again
after any failure that suggests it moved: every endpoint is asked ``POST
/v3/maintenance/status`` at once; the answer with the highest ``raft_term`` names the leader's
member id, and each answer's ``header.member_id`` tells which configured endpoint is which
member. A leader that is not among the configured endpoints is looked up in the member list
(``GET /v1/status``, else ``POST /v3/cluster/member/list``) and reached through its first
client URL. Serializable reads, status and member calls stay on the endpoint that last
answered (any node can serve them).

Retries. One call has an overall deadline (``timeout_s``); each HTTP attempt is bounded by
``attempt_timeout_s`` (connecting by ``connect_timeout_s``), and at most ``retries`` attempts
follow the first. Only ``retryable`` failures are retried — no connection, a broken
connection, no answer in time, HTTP 503 (no leader, leader changed, request timed out) or
502/504. After such a failure the call moves at once to an endpoint not yet tried in this
round; when every endpoint has failed in the round it sleeps (exponential backoff from
``backoff_initial_s`` to ``backoff_max_s``, with jitter) and starts a new round. Anything else
(400 invalid argument, compacted revision, 404, ...) ends the call on the first answer.
When retries or time run out the call raises the last failure's type — or
``ConnectionFailedError`` if no endpoint could be reached at all — with every attempt listed.

Auth (etcd v3): with ``user`` and ``password`` the client authenticates
(``/v3/auth/authenticate``) on the first call that needs it and sends the token raw in the
``Authorization`` header, as etcd's gateway takes it. Tokens are member-wide (the server
replicates their digests through raft), so one token serves every endpoint. When a server
answers ``etcdserver: invalid auth token`` (expired, or the member restarted) or ``user name
is empty`` (auth was enabled after we found it disabled), the call authenticates again once and
re-sends the request. When the cluster answers ``authentication is not enabled`` the client
sends no token. Without ``user`` no header is sent.

TLS: ``https://`` endpoints are verified with ``ca_file`` (else the system CAs), and
``cert_file``/``key_file`` are presented as a client certificate (etcdctl's ``--cacert --cert
--key``); or pass a ready ``ssl_context``. A refused handshake is a ``ConnectionFailedError``
saying "TLS handshake failed".

One ``aiohttp.ClientSession`` (keep-alive connections, at most ``max_connections``) is created
on first use; an ``AsyncClient`` belongs to the event loop that first used it. Close it with
``await client.close()`` or ``async with AsyncClient(...) as client``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from kvserver.client import codec, leases, members
from kvserver.client.errors import (
    Attempt,
    ClientError,
    CompactedError,
    ConnectionFailedError,
    NotFoundError,
    RequestTimeoutError,
    ResponseFormatError,
    UnavailableError,
    UnimplementedError,
    from_http,
)
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

log = logging.getLogger("raftkv.client")

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
MAX_ENDPOINTS = 64
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a range answer can be big, but not unbounded
MAX_RETRIES = 1000
UINT64_MAX = (1 << 64) - 1

T = TypeVar("T")


class Route(Enum):
    LEADER = "leader"  # writes and linearizable reads
    ANY = "any"  # serializable reads, status, member list


def normalize_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """``http://host:port`` URLs from a list or a comma-separated string; ``host:port`` gets
    ``http://``; trailing slashes go; duplicates are dropped (order kept)."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out: list[str] = []
    for item in items:
        url = str(item).strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bad endpoint {item!r}: want http://host:port")
        try:
            parts.port  # noqa: B018  # raises ValueError on a malformed port
        except ValueError:
            raise ValueError(f"bad endpoint {item!r}: bad port") from None
        if parts.path or parts.query:
            raise ValueError(f"bad endpoint {item!r}: want http://host:port without a path")
        if url not in out:
            out.append(url)
    if not out:
        raise ValueError("no endpoints given")
    if len(out) > MAX_ENDPOINTS:
        raise ValueError(f"too many endpoints ({len(out)} > {MAX_ENDPOINTS})")
    return tuple(out)


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
        self._endpoints = normalize_endpoints(endpoints)
        if password is not None and not user:
            raise ValueError("password given without user")
        if user and password is None:
            raise ValueError(f"user {user!r} given without password")
        self._user = user or None
        self._password = password
        self._token: str | None = None  # the current auth token ("" : auth is not enabled)
        self._auth_lock: asyncio.Lock | None = None
        # https endpoints: ssl_context as given, else one built from the files (etcdctl's
        # --cacert/--cert/--key; no ca_file: the system CAs). Loaded now: a bad file fails here.
        if ssl_context is not None and (ca_file or cert_file or key_file):
            raise ValueError("give ssl_context or ca_file/cert_file/key_file, not both")
        if ssl_context is None and (ca_file or cert_file or key_file):
            ssl_context = client_context(ca_file, cert_file, key_file)
        self._ssl: ssl.SSLContext | bool = True if ssl_context is None else ssl_context
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
        self._timeout_s = float(timeout_s)
        self._attempt_timeout_s = float(attempt_timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._retries = retries
        self._backoff_initial_s = float(backoff_initial_s)
        self._backoff_max_s = max(float(backoff_max_s), self._backoff_initial_s)
        self._prefer_leader = prefer_leader
        self._max_connections = max_connections
        self._max_response_bytes = max_response_bytes
        self._rng = rng or random.Random()
        if client_id is None:
            client_id = random.SystemRandom().getrandbits(64) or 1
        if not 0 < client_id <= UINT64_MAX:
            raise ValueError(f"client_id must be a non-zero uint64, got {client_id!r}")
        self._client_id = client_id
        self._request_ids = itertools.count(1)

        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._leader: str | None = None  # endpoint of the leader, when known
        self._current: str | None = None  # the endpoint that answered last
        self._round_robin = 0
        self._member_endpoints: dict[int, str] = {}  # member id -> endpoint, as learned
        self._discovery_lock: asyncio.Lock | None = None
        self._last_discovery_s = float("-inf")
        self._last_discovery_found = False

    # -----------------------------------------------------------------------------------------
    # Properties and lifecycle

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    @property
    def client_id(self) -> int:
        return self._client_id

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def leader_endpoint(self) -> str | None:
        """The leader's endpoint as last discovered (``None`` when unknown)."""
        return self._leader

    @property
    def user(self) -> str | None:
        return self._user

    async def close(self) -> None:
        self._closed = True
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncClient(endpoints={list(self._endpoints)!r}, "
            f"timeout_s={self._timeout_s}, leader={self._leader!r})"
        )

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None:
            if self._closed:
                raise ClientError("the client is closed")
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ttl_dns_cache=60, ssl=self._ssl
            )
            self._http = aiohttp.ClientSession(connector=connector)
            self._loop = loop
        elif loop is not self._loop:
            # aiohttp sessions (and our discovery lock) belong to one loop.
            raise ClientError(
                "this AsyncClient was first used on another event loop; "
                "create one client per loop (or use the blocking Client)"
            )
        return self._http

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
            self,
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

        return tuple(await asyncio.gather(*(one(ep) for ep in self._endpoints)))

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
        if self._user is None:
            return {}
        if self._token is None:
            loop = asyncio.get_running_loop()
            await self._authenticate(
                None, loop.time() + self._timeout_s if deadline_s is None else deadline_s
            )
        return {"Authorization": self._token} if self._token else {}

    async def refresh_token(self, used: str | None, deadline_s: float) -> None:
        """Authenticate again unless another call already replaced the token ``used``."""
        await self._authenticate(used, deadline_s, force=True)

    async def _authenticate(
        self, used: str | None, deadline_s: float, *, force: bool = False
    ) -> None:
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if self._token is not None and (not force or self._token != (used or "")):
                return  # set (or replaced) by a call that held the lock before us
            loop = asyncio.get_running_loop()
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                raise RequestTimeoutError("no time left to authenticate", operation="authenticate")
            try:
                doc = await self._call(
                    "authenticate",
                    "POST",
                    "/v3/auth/authenticate",
                    {"name": self._user, "password": self._password},
                    _plain(lambda doc: doc),
                    Route.ANY,
                    authenticated=False,
                    timeout_s=remaining_s,
                )
            except ClientError as err:
                if err.message == _AUTH_NOT_ENABLED:
                    self._token = ""  # etcd's client too: no token while auth is off
                    return
                raise
            token = doc.get("token") if isinstance(doc, dict) else None
            if not isinstance(token, str) or not token:
                raise ResponseFormatError("authenticate: the answer has no token")
            self._token = token

    async def find_leader(self) -> str | None:
        """Discover the leader now (ignoring what is cached); its endpoint, or ``None``."""
        self._leader = None
        self._last_discovery_s = float("-inf")
        self._last_discovery_found = False
        loop = asyncio.get_running_loop()
        return await self._discover(loop.time() + self._timeout_s)

    # -----------------------------------------------------------------------------------------
    # The request loop

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
        authenticated: bool = True,
        timeout_s: float | None = None,
    ) -> T:
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        deadline_s = start_s + (self._timeout_s if timeout_s is None else timeout_s)
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        if write:
            # The same pair on every attempt of this call: the server applies the write once.
            headers[CLIENT_ID_HEADER] = str(self._client_id)
            headers[REQUEST_ID_HEADER] = str(next(self._request_ids))
        reauthenticated = not (authenticated and self._user is not None)
        if not reauthenticated:
            headers.update(await self.auth_headers(deadline_s))
        limit = self._retries + 1 if max_attempts is None else max_attempts
        attempts: list[Attempt] = []
        last_error: ClientError | None = None
        failed_in_round: set[str] = set()
        backoff_s = self._backoff_initial_s
        while True:
            endpoint = pinned or await self._pick(route, failed_in_round, deadline_s)
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                break
            try:
                doc = await self._send(
                    endpoint, method, path, body, headers, min(remaining_s, self._attempt_timeout_s)
                )
                result = decode(doc, endpoint)
            except ClientError as err:
                attempts.append(Attempt(endpoint, err.message, type(err).__name__))
                if not reauthenticated and err.message in _REAUTHENTICATE:
                    # The token expired or its member restarted, or auth was enabled since
                    # we looked: authenticate again, once per call, and re-send.
                    reauthenticated = True
                    await self.refresh_token(headers.pop("Authorization", None), deadline_s)
                    headers.update(await self.auth_headers(deadline_s))
                    continue
                if not err.retryable:
                    raise err.with_context(what, tuple(attempts)) from None
                last_error = err
                self._note_failure(endpoint, err)
                log.debug(
                    "%s: attempt %d at %s failed: %s", what, len(attempts), endpoint, err.message
                )
                if len(attempts) >= limit:
                    break
                failed_in_round.add(endpoint)
                if pinned is None and self._untried(failed_in_round):
                    continue  # fail over to another endpoint at once
                failed_in_round.clear()
                delay_s = min(backoff_s * (0.5 + self._rng.random() / 2), deadline_s - loop.time())
                if delay_s <= 0:
                    break
                await asyncio.sleep(delay_s)
                backoff_s = min(backoff_s * 2, self._backoff_max_s)
                continue
            self._current = endpoint
            return result
        raise self._give_up(what, attempts, loop.time() - start_s, last_error)

    def _untried(self, failed: set[str]) -> bool:
        return any(ep not in failed for ep in self._endpoints)

    def _give_up(
        self, what: str, attempts: list[Attempt], elapsed_s: float, last_error: ClientError | None
    ) -> ClientError:
        if not attempts:
            return RequestTimeoutError(
                f"no attempt fit in the {self._timeout_s:g} s timeout", operation=what
            )
        if len(attempts) == 1 and last_error is not None:
            return last_error.with_context(what, tuple(attempts))
        tried = tuple(dict.fromkeys(a.endpoint for a in attempts))
        summary = f"gave up after {len(attempts)} attempt(s) in {elapsed_s:.2f} s"
        if all(a.error == ConnectionFailedError.__name__ for a in attempts):
            detail = f": {attempts[0].reason}" if len(attempts) == 1 else ""
            return ConnectionFailedError(
                f"could not reach any endpoint ({', '.join(tried)}){detail}; {summary}",
                endpoints=tried,
                endpoint=attempts[-1].endpoint,
                operation=what,
                attempts=tuple(attempts),
            )
        last = attempts[-1]
        cls: type[ClientError] = _RETRYABLE_BY_NAME.get(last.error, UnavailableError)
        return cls(
            f"{last.reason} ({summary})",
            endpoint=last.endpoint,
            operation=what,
            attempts=tuple(attempts),
        )

    def _note_failure(self, endpoint: str, err: ClientError) -> None:
        if endpoint == self._leader or err.code is not None:
            # The leader failed, or some node said "no leader" / "leader changed": look again.
            self._leader = None
        if endpoint == self._current:
            self._current = None

    async def _pick(self, route: Route, failed: set[str], deadline_s: float) -> str:
        if route is Route.LEADER and self._prefer_leader:
            leader = self._leader
            if leader is None:
                leader = await self._discover(deadline_s)
            if leader is not None and leader not in failed:
                return leader
        candidates = [ep for ep in self._endpoints if ep not in failed] or list(self._endpoints)
        if self._current in candidates:
            return self._current  # type: ignore[return-value]
        self._round_robin += 1
        return candidates[self._round_robin % len(candidates)]

    async def _send(
        self,
        endpoint: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
    ) -> Any:
        """One HTTP attempt; the parsed JSON of a 200 answer, or a typed ``ClientError``."""
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(self._connect_timeout_s, timeout_s)
        )
        try:
            async with self._session().request(
                method, endpoint + path, data=body, headers=headers, timeout=timeout
            ) as resp:
                status = resp.status
                raw = await self._read_body(resp, endpoint)
        except aiohttp.ConnectionTimeoutError:
            raise ConnectionFailedError(
                f"cannot connect: no answer within {min(self._connect_timeout_s, timeout_s):g} s",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientSSLError as exc:  # (a ClientConnectorError) a refused handshake
            raise ConnectionFailedError(
                f"TLS handshake failed: {exc.os_error or exc}",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                reason = "connection refused"
            else:
                reason = exc.os_error.strerror or str(exc)
            raise ConnectionFailedError(
                f"cannot connect: {reason}", endpoints=(endpoint,), endpoint=endpoint
            ) from None
        except TimeoutError:
            raise RequestTimeoutError(
                f"no answer within {timeout_s:.3g} s", endpoint=endpoint
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionFailedError(
                f"connection lost: {exc or type(exc).__name__}",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientError as exc:
            raise ClientError(f"HTTP client error: {exc}", endpoint=endpoint) from None
        if status != 200:
            raise from_http(status, raw, endpoint)
        try:
            return json.loads(raw)
        except ValueError:
            snippet = raw[:80].decode("utf-8", "replace")
            raise ResponseFormatError(
                f"answer is not JSON: {snippet!r}", http_status=status, endpoint=endpoint
            ) from None

    async def _read_body(self, resp: aiohttp.ClientResponse, endpoint: str) -> bytes:
        limit = self._max_response_bytes
        if resp.content_length is not None:
            if resp.content_length > limit:
                raise ResponseFormatError(
                    f"answer of {resp.content_length} bytes is over the {limit}-byte limit",
                    endpoint=endpoint,
                )
            return await resp.read()  # the common case: one call, length already bounded
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise ResponseFormatError(
                    f"answer is over the {limit}-byte limit", endpoint=endpoint
                )
            chunks.append(chunk)
        return b"".join(chunks)

    # -----------------------------------------------------------------------------------------
    # Leader discovery

    async def _discover(self, deadline_s: float) -> str | None:
        if self._discovery_lock is None:
            self._discovery_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        async with self._discovery_lock:
            if self._leader is not None:
                return self._leader  # found by a call that held the lock before us
            if (
                not self._last_discovery_found
                and loop.time() - self._last_discovery_s < self._backoff_initial_s
            ):
                return None  # just looked and found none; don't storm the cluster
            timeout_s = min(deadline_s - loop.time(), self._attempt_timeout_s)
            if timeout_s <= 0:
                return None
            try:
                self._leader = await self._find_leader_once(timeout_s)
            finally:
                self._last_discovery_s = loop.time()
                self._last_discovery_found = self._leader is not None
            if self._leader is not None:
                log.debug("leader is at %s", self._leader)
            return self._leader

    async def _find_leader_once(self, timeout_s: float) -> str | None:
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s

        async def ask(endpoint: str) -> Status:
            doc = await self._send(
                endpoint,
                "POST",
                "/v3/maintenance/status",
                b"{}",
                {"Content-Type": "application/json"},
                timeout_s,
            )
            return codec.decode_status(doc, endpoint)

        tasks = [asyncio.ensure_future(ask(ep)) for ep in self._endpoints]
        best: Status | None = None  # the answer naming a leader in the highest term
        answered: list[str] = []
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    status = await next_done
                except ClientError:
                    continue
                answered.append(status.endpoint)
                self._member_endpoints[status.member_id] = status.endpoint
                if status.leader and (best is None or status.raft_term > best.raft_term):
                    best = status
                if best is status and status.is_leader:
                    break  # the leader itself answered: nobody can name a newer one sooner
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if best is None:
            return None
        known = self._member_endpoints.get(best.leader)
        if known is not None:
            return known
        # The leader is not one of our endpoints: find its client URL in the member list.
        for endpoint in answered:
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                break
            try:
                members = await self._members_once(endpoint, remaining_s)
            except ClientError:
                continue
            for member in members:
                if member.id == best.leader and member.client_urls:
                    try:
                        url = normalize_endpoints([member.client_urls[0]])[0]
                    except ValueError:
                        return None
                    self._member_endpoints[member.id] = url
                    return url
            return None
        return None

    async def _members_once(self, endpoint: str, timeout_s: float) -> tuple[Member, ...]:
        try:
            doc = await self._send(endpoint, "GET", "/v1/status", None, {}, timeout_s)
        except (NotFoundError, UnimplementedError):
            doc = await self._send(
                endpoint,
                "POST",
                "/v3/cluster/member/list",
                b"{}",
                {"Content-Type": "application/json"},
                timeout_s,
            )
        return codec.decode_members(doc)


def _plain(decode: Callable[[Any], T]) -> Callable[[Any, str], T]:
    """A decoder that does not need to know which endpoint answered."""
    return lambda doc, endpoint: decode(doc)


_decode_members = _plain(codec.decode_members)

_AUTH_NOT_ENABLED = "etcdserver: authentication is not enabled"
INVALID_AUTH_TOKEN = "etcdserver: invalid auth token"
_REAUTHENTICATE = frozenset({INVALID_AUTH_TOKEN, "etcdserver: user name is empty"})


def _retryable_classes() -> dict[str, type[ClientError]]:
    found: dict[str, type[ClientError]] = {}
    pending: list[type[ClientError]] = [UnavailableError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


_RETRYABLE_BY_NAME = _retryable_classes()

__all__ = ["AsyncClient", "DEFAULT_ENDPOINT", "Route", "normalize_endpoints"]
