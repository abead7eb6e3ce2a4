"""The client's one retry engine: endpoints, the leader, failover, backoff, deadlines, re-auth.

Every request of ``AsyncClient`` and every (re)connect of a watch goes through
``RetryEngine.run``, which makes attempts until one succeeds, a failure that a retry will not
fix comes back, or attempts or time run out:

- Routing. ``Route.LEADER`` (writes, linearizable reads, watches) goes to the leader when it
  is known, found lazily and again after any failure that suggests it moved: every endpoint
  is asked ``POST /v3/maintenance/status`` at once; the answer with the highest ``raft_term``
  names the leader's member id, and each answer's ``header.member_id`` tells which configured
  endpoint is which member. A leader that is not among the configured endpoints is looked up
  in the member list (``GET /v1/status``, else ``POST /v3/cluster/member/list``) and reached
  through its first client URL. ``Route.ANY`` stays on the endpoint that last answered. A
  ``pinned`` endpoint gets every attempt.
- Retries. The run has a deadline; each attempt is bounded by ``attempt_timeout_s`` and the
  time left. Only ``retryable`` failures are retried. After one the run moves at once to an
  endpoint not yet tried in this round; when every endpoint has failed in the round it sleeps
  (exponential backoff from ``backoff_initial_s`` to ``backoff_max_s``, with jitter) and
  starts a new round. When attempts or time run out it raises the last failure's type — or
  ``ConnectionFailedError`` if no endpoint could be reached at all — with every attempt
  listed.
- Auth (etcd v3). With a user, each attempt carries the ``Authorization`` header (the token
  raw, as etcd's gateway takes it), authenticating first when there is no token yet. Tokens
  are member-wide, so one token serves every endpoint. When a server answers ``etcdserver:
  invalid auth token`` (expired, or the member restarted) or ``user name is empty`` (auth was
  enabled after we found it disabled), the run authenticates again once and re-sends. When
  the cluster answers ``authentication is not enabled`` no token is sent.

The engine belongs to the event loop that first used it (its locks and the transport's
connection pool do).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kvserver.client import codec
from kvserver.client.errors import (
    Attempt,
    ClientError,
    ConnectionFailedError,
    NotFoundError,
    RequestTimeoutError,
    ResponseFormatError,
    UnavailableError,
    UnimplementedError,
)
from kvserver.client.transport import HttpTransport
from kvserver.client.types import Member, Status

log = logging.getLogger("raftkv.client")

MAX_ENDPOINTS = 64

AUTH_NOT_ENABLED = "etcdserver: authentication is not enabled"
INVALID_AUTH_TOKEN = "etcdserver: invalid auth token"
REAUTHENTICATE = frozenset({INVALID_AUTH_TOKEN, "etcdserver: user name is empty"})

T = TypeVar("T")

# One attempt: (endpoint, time it may take, the Authorization header or nothing) -> result.
AttemptFn = Callable[[str, float, dict[str, str]], Awaitable[T]]


class Route(Enum):
    LEADER = "leader"  # writes, linearizable reads, watches
    ANY = "any"  # serializable reads, status, member list


class Stopped(Exception):
    """``RetryEngine.run`` ended because its ``stopped`` callback said so."""


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


class RetryEngine:
    """Endpoints, routing state, backoff, deadlines and the auth token (see the module
    docstring). Its arguments are checked by ``AsyncClient``."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        transport: HttpTransport,
        *,
        timeout_s: float,
        attempt_timeout_s: float,
        retries: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        prefer_leader: bool,
        rng: random.Random,
        user: str | None,
        password: str | None,
    ) -> None:
        self._endpoints = endpoints
        self._transport = transport
        self._timeout_s = timeout_s
        self._attempt_timeout_s = attempt_timeout_s
        self._retries = retries
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._prefer_leader = prefer_leader
        self._rng = rng
        self._user = user
        self._password = password
        self._token: str | None = None  # the current auth token ("" : auth is not enabled)
        self._auth_lock: asyncio.Lock | None = None
        self._leader: str | None = None  # endpoint of the leader, when known
        self._current: str | None = None  # the endpoint that answered last
        self._round_robin = 0
        self._member_endpoints: dict[int, str] = {}  # member id -> endpoint, as learned
        self._discovery_lock: asyncio.Lock | None = None
        self._last_discovery_s = float("-inf")
        self._last_discovery_found = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    @property
    def timeout_s(self) -> float:
        """A call's overall deadline, unless the run is given another."""
        return self._timeout_s

    @property
    def leader(self) -> str | None:
        """The leader's endpoint as last discovered (``None`` when unknown)."""
        return self._leader

    @property
    def user(self) -> str | None:
        return self._user

    @property
    def transport(self) -> HttpTransport:
        return self._transport

    # -----------------------------------------------------------------------------------------
    # The retry loop

    async def run(
        self,
        what: str,
        attempt: AttemptFn[T],
        route: Route,
        *,
        timeout_s: float | None = None,
        max_attempts: int | None = None,
        pinned: str | None = None,
        authenticated: bool = True,
        reauthenticate_on: Collection[str] = REAUTHENTICATE,
        stopped: Callable[[], bool] | None = None,
    ) -> T:
        """``attempt`` until it returns (its result), a failure that is not ``retryable``
        comes back (raised, with the attempts so far), or ``max_attempts`` (``None``: no limit)
        or ``timeout_s`` (default: the client's) run out (the give-up error). ``what`` names
        the operation in errors. ``authenticated=False``: no ``Authorization`` header and no
        re-authentication. ``stopped``: checked before each attempt; once true the run raises
        ``Stopped``."""
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        deadline_s = start_s + (self._timeout_s if timeout_s is None else timeout_s)
        auth = authenticated and self._user is not None
        reauthenticated = not auth
        attempts: list[Attempt] = []
        last_error: ClientError | None = None
        failed_in_round: set[str] = set()
        backoff_s = self._backoff_initial_s
        while stopped is None or not stopped():
            auth_headers = await self.auth_headers(deadline_s) if auth else {}
            endpoint = pinned or await self._pick(route, failed_in_round, deadline_s)
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                break
            try:
                result = await attempt(
                    endpoint, min(remaining_s, self._attempt_timeout_s), auth_headers
                )
            except ClientError as err:
                attempts.append(Attempt(endpoint, err.message, type(err).__name__))
                if not reauthenticated and err.message in reauthenticate_on:
                    # The token expired or its member restarted, or auth was enabled since
                    # we looked: authenticate again, once per run, and re-send.
                    reauthenticated = True
                    await self.refresh_token(auth_headers.get("Authorization"), deadline_s)
                    continue
                if not err.retryable:
                    raise err.with_context(what, tuple(attempts)) from None
                last_error = err
                self.note_failure(endpoint, err)
                log.debug(
                    "%s: attempt %d at %s failed: %s", what, len(attempts), endpoint, err.message
                )
                if max_attempts is not None and len(attempts) >= max_attempts:
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
        if stopped is not None and stopped():
            raise Stopped(what)
        raise self._give_up(what, attempts, loop.time() - start_s, last_error)

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
        decode: Callable[[Any, str], T],
        route: Route,
        *,
        headers: dict[str, str] | None = None,
        pinned: str | None = None,
        max_attempts: int | None = None,
        authenticated: bool = True,
        timeout_s: float | None = None,
    ) -> T:
        """One JSON call through ``run``: ``payload`` (``None``: no body) sent with
        ``headers`` on every attempt, the answer decoded by ``decode(doc, endpoint)``. At most
        ``max_attempts`` attempts (default: 1 + the client's ``retries``)."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        fixed = {} if body is None else {"Content-Type": "application/json"}
        fixed.update(headers or {})

        async def attempt(endpoint: str, timeout_s: float, auth_headers: dict[str, str]) -> T:
            doc = await self._transport.send(
                endpoint, method, path, body, {**fixed, **auth_headers}, timeout_s
            )
            return decode(doc, endpoint)

        return await self.run(
            what,
            attempt,
            route,
            timeout_s=timeout_s,
            max_attempts=self._retries + 1 if max_attempts is None else max_attempts,
            pinned=pinned,
            authenticated=authenticated,
        )

    def note_failure(self, endpoint: str, err: ClientError) -> None:
        """``endpoint`` failed with ``err``: forget it as the leader or the current endpoint
        when that is what the failure suggests."""
        if endpoint == self._leader or err.code is not None:
            # The leader failed, or some node said "no leader" / "leader changed": look again.
            self._leader = None
        if endpoint == self._current:
            self._current = None

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

    # -----------------------------------------------------------------------------------------
    # Auth

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
                doc = await self.request(
                    "authenticate",
                    "POST",
                    "/v3/auth/authenticate",
                    {"name": self._user, "password": self._password},
                    lambda doc, _endpoint: doc,
                    Route.ANY,
                    authenticated=False,
                    timeout_s=remaining_s,
                )
            except ClientError as err:
                if err.message == AUTH_NOT_ENABLED:
                    self._token = ""  # etcd's client too: no token while auth is off
                    return
                raise
            token = doc.get("token") if isinstance(doc, dict) else None
            if not isinstance(token, str) or not token:
                raise ResponseFormatError("authenticate: the answer has no token")
            self._token = token

    # -----------------------------------------------------------------------------------------
    # Leader discovery

    async def find_leader(self) -> str | None:
        """Discover the leader now (ignoring what is cached); its endpoint, or ``None``."""
        self._leader = None
        self._last_discovery_s = float("-inf")
        self._last_discovery_found = False
        loop = asyncio.get_running_loop()
        return await self._discover(loop.time() + self._timeout_s)

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
            doc = await self._transport.send(
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
            doc = await self._transport.send(endpoint, "GET", "/v1/status", None, {}, timeout_s)
        except (NotFoundError, UnimplementedError):
            doc = await self._transport.send(
                endpoint,
                "POST",
                "/v3/cluster/member/list",
                b"{}",
                {"Content-Type": "application/json"},
                timeout_s,
            )
        return codec.decode_members(doc)


def _retryable_classes() -> dict[str, type[ClientError]]:
    found: dict[str, type[ClientError]] = {}
    pending: list[type[ClientError]] = [UnavailableError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


_RETRYABLE_BY_NAME = _retryable_classes()
