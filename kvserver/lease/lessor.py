"""The lessor: etcd's leases (grant, revoke, keep-alive, time-to-live, expiry) for raftkv.

Modelled on etcd's ``server/lease/lessor.go`` (semantics, not code). A lease is an ID, a
granted TTL in seconds and the keys attached to it; when it is revoked — by a client or
because it expired — its keys are deleted in the revoking revision. Its neighbours: the
client's messages are ``kvserver.kvpb.lease``, the errors ``kvserver.lease.errors``, the raft
log entries ``kvserver.lease.codec``, the snapshot bytes ``kvserver.lease.snapshot``.

Two halves
----------
*Replicated, deterministic.* The lease table ``{id: (ttl_s, remaining_ttl_s)}`` changes only
when a committed raft entry is applied (``apply`` / ``apply_entry``): grant, revoke,
checkpoint. Every member applies the same entries in the same order and gets the same
table, the same results and the same snapshot bytes; no clock or configuration is read on
this path (``HARD_MAX_LEASES`` and ``MAX_LEASE_TTL_S`` are code constants). Which keys belong
to which lease is not kept here: the MVCC store is the source of truth (its records carry the
lease; ``keys_with_lease`` / ``delete_keys_of_lease``), so a store snapshot and a lessor
snapshot taken at the same applied index always agree.

*Leader-only timing, local.* Each lease's expiry deadline on this member's monotonic clock
(``clock``, injected; tests pass a fake one and never sleep). Only a *primary* lessor (this
member is the raft leader and has applied the first entry of its term) has finite deadlines:
``keepalive``, ``time_to_live``, ``expired`` and ``due_checkpoints`` are primary-only; a
follower keeps every deadline at infinity and answers ``NotPrimaryError``. ``promote(extend_s)``
gives every lease a fresh deadline of now + (checkpointed remaining TTL, else the granted TTL)
+ ``extend_s``, so a leader change never expires a lease early (etcd's ``Promote``);
``demote()`` sets every deadline back to infinity. A lease is only ever expired by proposing a
revoke through raft: ``expired()`` lists the leases whose deadline passed, and lists each again
only after ``expired_retry_interval_s`` in case that revoke was lost. Once a lease's deadline
has passed, ``keepalive`` refuses it (``LeaseExpiredError``): the revoke may already be in
flight, and refreshing would let a client believe in a lease that is about to vanish.

The lessor neither checks leadership nor waits nor forwards: the service over it confirms it
still leads before a keep-alive or time-to-live, waits on an expired lease until its revoke is
applied, and turns ``NotPrimaryError`` into etcd's ``not leader``, which the HTTP layer forwards
to the leader.

Checkpoints (optional, etcd's ``--experimental-enable-lease-checkpoint``): with
``checkpoint_interval_s`` set, a primary periodically offers ``due_checkpoints()`` —
``(id, remaining_ttl_s)`` pairs to replicate in a checkpoint entry — so a new leader resumes a
long lease from its remaining TTL instead of the full TTL. A keep-alive of a checkpointed lease
queues a clearing checkpoint ``(id, 0)``.

Differences from etcd
---------------------
- A negative TTL is refused (``InvalidArgumentError``: bad input is an error, never silently
  changed); etcd silently raises it to the minimum TTL. A TTL of 0 is raised to the minimum,
  as in etcd.
- The minimum TTL is applied when the request is *proposed* (``prepare_grant``), not when it
  is applied, so members with different election timeouts cannot disagree on a lease's TTL.
- ``max_leases`` is an admission bound checked at propose time (approximate under concurrent
  grants); the replicated bound is the constant ``HARD_MAX_LEASES``.
- ``time_to_live`` of an unknown lease answers ``ttl_s == -1`` (what etcd's gRPC layer turns
  the lessor's not-found into), so the HTTP layer needs no special case.
- Lease state (with the remaining TTL) is always in snapshots (etcd 3.6 behaviour).

Retried requests (de-duplication)
---------------------------------
Grant and revoke entries carry the client's ``(client_id, request_id)`` (HTTP headers
``X-Raftkv-Client-Id`` / ``X-Raftkv-Request-Id``, as KV writes). With ``client_id != 0`` the
lessor remembers the outcome of the first *applied* entry with that pair in its own
``kvserver.mvcc.dedup.DedupTable`` (same contract and bounds as the store's table:
``dedup_ids_per_client`` ids of each of the ``dedup_max_clients`` most recently active
clients; a retry after its id was evicted is applied again). A later entry with the same pair
changes nothing and answers the first outcome (``ApplyResult.duplicate``): the first grant's
response — the same lease ID even when the retry was proposed with another server-chosen ID
(``prepare_grant`` picks the ID at propose time, so a retry proposes a fresh one; the apply
ignores it) — or the first error, e.g. a revoke retried after it succeeded answers success,
not "not found". The pair is looked up at apply time only, so every replica answers alike
whatever it had applied when the retry was proposed; ``prepare_grant(..., client_id,
request_id)`` merely skips its early "already exists" / "too many leases" refusals for a pair
it remembers, so a retried client-chosen grant reaches the log and gets its first answer. A
pair first used by a grant and reused by a revoke (or vice versa) is a client bug: it answers
``InvalidArgumentError`` and changes nothing. Checkpoint entries are not de-duplicated.

Why a table of its own and not the store's: the store snapshots its outcomes with the MVCC
codec, which has no lease types, and KV and lease requests never share a pair (a client
numbers all its requests from one counter), so two tables answer exactly as one would. The
lessor's table travels in the lease snapshot (``kvserver.lease.outcomes``), taken at the same
applied index as the store's, so a restored or newly elected member answers retries the same.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from kvserver.kvpb.errors import (
    CodecError,
    EtcdError,
    InvalidArgumentError,
    LeaseNotFoundError,
)
from kvserver.kvpb.kv import ApplyResult, ResponseHeader
from kvserver.kvpb.lease import (
    MAX_LEASE_TTL_S,
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseLeasesResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
    LeaseTimeToLiveResponse,
)
from kvserver.lease.codec import (
    INT64_MAX,
    INT64_MIN,
    LeaseCheckpointRequest,
    LeaseCheckpointResponse,
    decode_lease_entry,
)
from kvserver.lease.errors import (
    LeaseExistsError,
    LeaseExpiredError,
    LeaseTTLTooLargeError,
    NotPrimaryError,
    TooManyLeasesError,
)
from kvserver.lease.outcomes import RESPONSE_TYPE
from kvserver.lease.snapshot import decode_snapshot, encode_snapshot
from kvserver.mvcc.dedup import DEFAULT_IDS_PER_CLIENT, DEFAULT_MAX_CLIENTS, MISS, DedupTable

__all__ = [
    "DEFAULT_MAX_LEASES",
    "DEFAULT_MIN_TTL_S",
    "HARD_MAX_LEASES",
    "LeaseIdGenerator",
    "LeaseInfo",
    "LeaseKeyStore",
    "Lessor",
    "min_lease_ttl_s",
]

# etcd's minimum with its default timing (heartbeat 100 ms, election 1000 ms): see
# min_lease_ttl_s.
DEFAULT_MIN_TTL_S = 2
# Admission bound checked when a grant is proposed (configurable per member).
DEFAULT_MAX_LEASES = 100_000
# Replicated bound checked when a grant is applied. A code constant, identical on every
# member, so it can never make replicas disagree.
HARD_MAX_LEASES = 1_000_000
# etcd: leaseRevokeRate (revokes per second), half of it per 0.5 s round.
DEFAULT_REVOKE_RATE_PER_S = 1000
DEFAULT_EXPIRED_RETRY_INTERVAL_S = 3.0  # etcd: defaultExpiredleaseRetryInterval
DEFAULT_CHECKPOINT_BATCH = 1000  # etcd: maxLeaseCheckpointBatchSize

MSG_NEGATIVE_TTL = "raftkv: lease TTL must not be negative"
MSG_REQUEST_ID_REUSED = "raftkv: request id already used by a different lease request"

_FOREVER = math.inf


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A read-only view of one lease (``Lessor.lookup``)."""

    lease_id: int
    ttl_s: int
    remaining_ttl_s: int  # checkpointed remaining TTL; 0 = none
    expiry: float  # deadline on the lessor's clock; inf when not primary


class LeaseKeyStore(Protocol):
    """What the lessor needs from the MVCC store (``kvserver.mvcc.MVCCStore`` has it)."""

    lease_exists: Callable[[int], bool] | None

    @property
    def revision(self) -> int: ...

    def keys_with_lease(self, lease_id: int) -> list[bytes]: ...

    def delete_keys_of_lease(self, lease_id: int) -> ApplyResult: ...


def min_lease_ttl_s(heartbeat_ms: int, election_ms: int) -> int:
    """etcd's minimum lease TTL: 1.5 election timeouts (in whole ticks), rounded up to a
    second; 2 s with the default 100 ms / 1000 ms."""
    ticks = max(1, election_ms // max(1, heartbeat_ms))
    return max(1, math.ceil((3 * ticks // 2) * heartbeat_ms / 1000))


class LeaseIdGenerator:
    """Server-chosen lease IDs, unique across members without coordination (etcd's idutil
    scheme): bits 48-62 are the member id's low 15 bits, bits 0-47 a counter that starts at
    (milliseconds since the epoch << 8) when the generator is made and counts up, so a
    restarted member (a later start time) does not reuse its earlier IDs. Never 0, never
    negative."""

    __slots__ = ("_prefix", "_suffix")

    _SUFFIX_MASK = (1 << 48) - 1

    def __init__(self, member_id: int, now_ms: int) -> None:
        self._prefix = (member_id & 0x7FFF) << 48
        self._suffix = ((now_ms & ((1 << 40) - 1)) << 8) & self._SUFFIX_MASK

    def next(self) -> int:
        while True:
            self._suffix = (self._suffix + 1) & self._SUFFIX_MASK
            lease_id = self._prefix | self._suffix
            if lease_id != 0:
                return lease_id


# ---------------------------------------------------------------------------------------------
# The lessor


class _Lease:
    __slots__ = ("lease_id", "ttl_s", "remaining_ttl_s", "expiry", "deadline", "checkpoint_at")

    def __init__(self, lease_id: int, ttl_s: int, remaining_ttl_s: int) -> None:
        self.lease_id = lease_id
        self.ttl_s = ttl_s  # replicated; invariant: 1 <= ttl_s <= MAX_LEASE_TTL_S
        self.remaining_ttl_s = remaining_ttl_s  # replicated; 0 = no checkpoint
        self.expiry = _FOREVER  # local: when the lease expires (inf unless primary)
        # local: the key of this lease's live entry in the expiry heap — the expiry, or the
        # time to list it again after expired() reported it; inf = not in the heap.
        self.deadline = _FOREVER
        # local: when to offer the next checkpoint; the checkpoint heap entry with this time is
        # the live one, others are stale (inf = none scheduled).
        self.checkpoint_at = _FOREVER


def _header(store: LeaseKeyStore | None) -> ResponseHeader:
    return ResponseHeader(0, 0, store.revision if store is not None else 0, 0)


def _check_int64(name: str, value: Any) -> None:
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise InvalidArgumentError(f"raftkv: {name} must be an int64")


class Lessor:
    """etcd's lessor (see the module docstring). Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        *,
        store: LeaseKeyStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_ttl_s: int = DEFAULT_MIN_TTL_S,
        max_leases: int = DEFAULT_MAX_LEASES,
        checkpoint_interval_s: float | None = None,
        expired_retry_interval_s: float = DEFAULT_EXPIRED_RETRY_INTERVAL_S,
        revoke_rate_per_s: int = DEFAULT_REVOKE_RATE_PER_S,
        dedup_ids_per_client: int = DEFAULT_IDS_PER_CLIENT,
        dedup_max_clients: int = DEFAULT_MAX_CLIENTS,
    ) -> None:
        if min_ttl_s < 1 or max_leases < 1 or revoke_rate_per_s < 1:
            raise ValueError("min_ttl_s, max_leases and revoke_rate_per_s must be >= 1")
        if checkpoint_interval_s is not None and checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_interval_s must be positive (or None)")
        self.clock = clock
        self.min_ttl_s = min_ttl_s
        self.max_leases = max_leases
        self.checkpoint_interval_s = checkpoint_interval_s
        self.expired_retry_interval_s = expired_retry_interval_s
        self.revoke_rate_per_s = revoke_rate_per_s
        self._leases: dict[int, _Lease] = {}
        # Replicated: outcomes of applied grants/revokes by (client_id, request_id).
        self._dedup = DedupTable(dedup_ids_per_client, dedup_max_clients)
        self._primary = False
        self._expiry_heap: list[tuple[float, int]] = []  # (deadline, id); lazily invalidated
        self._checkpoint_heap: list[tuple[float, int]] = []  # (when, id); primary only
        self._pending_clears: set[int] = set()  # ids to checkpoint with 0 (primary only)
        self.store: LeaseKeyStore | None = None
        if store is not None:
            self.bind(store)

    def bind(self, store: LeaseKeyStore) -> None:
        """Use ``store`` for attached keys and make it ask this lessor whether a lease exists
        (call again after the store is replaced by a snapshot restore)."""
        self.store = store
        store.lease_exists = self.exists

    # -----------------------------------------------------------------------------------------
    # Introspection (any member)

    @property
    def is_primary(self) -> bool:
        return self._primary

    def __len__(self) -> int:
        return len(self._leases)

    def exists(self, lease_id: int) -> bool:
        return lease_id in self._leases

    @property
    def dedup(self) -> DedupTable:
        """The request-id table of applied grants and revokes (read it, do not change it)."""
        return self._dedup

    def remembers(self, client_id: int, request_id: int) -> bool:
        """Whether an entry with this pair was applied here (and not evicted since)."""
        return client_id != 0 and self._dedup.lookup(client_id, request_id) is not MISS

    def lookup(self, lease_id: int) -> LeaseInfo | None:
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        return LeaseInfo(lease.lease_id, lease.ttl_s, lease.remaining_ttl_s, lease.expiry)

    def leases(self) -> LeaseLeasesResponse:
        """All leases, soonest deadline first (etcd's LeaseLeases; served by any member)."""
        order = sorted(self._leases.values(), key=lambda lease: (lease.expiry, lease.lease_id))
        return LeaseLeasesResponse(_header(self.store), tuple(x.lease_id for x in order))

    # -----------------------------------------------------------------------------------------
    # Propose-time checks (the member that accepts the client request)

    def prepare_grant(
        self,
        req: LeaseGrantRequest,
        ids: LeaseIdGenerator | None = None,
        *,
        client_id: int = 0,
        request_id: int = 0,
    ) -> LeaseGrantRequest:
        """Check a client's grant and make the request to propose: TTL raised to
        ``min_ttl_s``, ID chosen from ``ids`` when 0 (skipping IDs granted here). Raises
        ``InvalidArgumentError`` (negative TTL, not an int64), ``LeaseTTLTooLargeError``,
        ``TooManyLeasesError`` or ``LeaseExistsError`` (early answer; apply checks again).
        The last two are skipped for a retry (``remembers(client_id, request_id)``): its
        entry must reach the log to be answered the first outcome."""
        _check_int64("TTL", req.ttl_s)
        _check_int64("ID", req.lease_id)
        if req.ttl_s < 0:
            raise InvalidArgumentError(MSG_NEGATIVE_TTL)
        if req.ttl_s > MAX_LEASE_TTL_S:
            raise LeaseTTLTooLargeError()
        retry = self.remembers(client_id, request_id)
        if not retry and len(self._leases) >= min(self.max_leases, HARD_MAX_LEASES):
            raise TooManyLeasesError()
        lease_id = req.lease_id
        if lease_id == 0:
            if ids is None:
                raise ValueError("a server-chosen lease ID needs a LeaseIdGenerator")
            lease_id = ids.next()
            while lease_id in self._leases:
                lease_id = ids.next()
        elif lease_id in self._leases and not retry:
            raise LeaseExistsError()
        return LeaseGrantRequest(max(req.ttl_s, self.min_ttl_s), lease_id)

    # -----------------------------------------------------------------------------------------
    # Replicated part: applied from committed raft entries, deterministic

    def apply(self, request: Any, client_id: int = 0, request_id: int = 0) -> ApplyResult:
        """Apply one committed lease request; never raises a client error (it is in
        ``ApplyResult.error`` and nothing changed). ``events`` are the deletions of a revoke.

        With ``client_id != 0`` a grant or revoke is de-duplicated on ``(client_id,
        request_id)``: a pair applied before changes nothing and returns the first outcome
        with ``duplicate=True`` (see the module docstring)."""
        kind = type(request)
        if client_id == 0 or (kind is not LeaseGrantRequest and kind is not LeaseRevokeRequest):
            return self._apply_once(request)
        seen = self._seen(kind, client_id, request_id)
        if seen is not None:
            return seen
        return self._remember(client_id, request_id, self._apply_once(request))

    def revoke_in_steps(
        self,
        request: LeaseRevokeRequest,
        client_id: int,
        request_id: int,
        delete_keys_in_steps: Callable[[int], Generator[None, None, ApplyResult]],
    ) -> Generator[None, None, ApplyResult]:
        """``apply`` of a revoke whose lease has many keys, the keys deleted in steps by
        ``delete_keys_in_steps(lease_id)`` (``MVCCStore.delete_keys_of_lease_in_steps``: one
        revision, invisible until the last step); yields None between steps. The caller
        applies nothing else meanwhile."""
        if client_id:
            seen = self._seen(LeaseRevokeRequest, client_id, request_id)
            if seen is not None:
                return seen
        lease_id = request.lease_id
        if lease_id not in self._leases or self.store is None:
            result = self._apply_once(request)  # the error, or a revoke without keys
        else:
            deleted = yield from delete_keys_in_steps(lease_id)
            self._forget(lease_id)
            result = self._result(LeaseRevokeResponse(_header(self.store)), deleted.events)
        if client_id:
            return self._remember(client_id, request_id, result)
        return result

    def _seen(self, kind: type, client_id: int, request_id: int) -> ApplyResult | None:
        """The first outcome of ``(client_id, request_id)`` if it was applied before, as a
        duplicate (marks the client most recently used)."""
        ids = self._dedup.client_ids(client_id)
        seen = ids.get(request_id, MISS)
        if seen is MISS:
            return None
        if isinstance(seen, EtcdError):
            return ApplyResult(None, seen, (), True, self._revision())
        if type(seen) is not RESPONSE_TYPE[kind]:
            error = InvalidArgumentError(MSG_REQUEST_ID_REUSED)
            return ApplyResult(None, error, (), True, self._revision())
        # seen is the response type this request kind answers (checked above)
        return ApplyResult(cast(Any, seen), None, (), True, self._revision())

    def _remember(self, client_id: int, request_id: int, result: ApplyResult) -> ApplyResult:
        ids = self._dedup.client_ids(client_id)
        ids[request_id] = result.error if result.error is not None else result.response
        if len(ids) > self._dedup.ids_per_client:
            ids.popitem(last=False)
        return result

    def _apply_once(self, request: Any) -> ApplyResult:
        kind = type(request)
        try:
            if kind is LeaseGrantRequest:
                response = self.grant(request.lease_id, request.ttl_s)
                return self._result(response)
            if kind is LeaseRevokeRequest:
                return self.revoke(request.lease_id)
            if kind is LeaseCheckpointRequest:
                self.checkpoint(request.checkpoints)
                return self._result(LeaseCheckpointResponse(_header(self.store)))
        except EtcdError as err:
            return ApplyResult(None, err, (), False, self._revision())
        error = InvalidArgumentError(f"raftkv: not a lease request: {kind.__name__}")
        return ApplyResult(None, error, (), False, self._revision())

    def apply_entry(self, data: bytes) -> ApplyResult:
        """Decode an ``encode_lease_entry`` entry and apply it. An undecodable entry is an
        ``InvalidArgumentError`` result on every member alike, never a crash."""
        try:
            client_id, request_id, request = decode_lease_entry(data)
        except CodecError as err:
            error = InvalidArgumentError(f"raftkv: undecodable lease entry: {err}")
            return ApplyResult(None, error, (), False, self._revision())
        return self.apply(request, client_id, request_id)

    def grant(self, lease_id: int, ttl_s: int) -> LeaseGrantResponse:
        """etcd's Grant, as applied: the ID and TTL are final (``prepare_grant`` chose them)."""
        _check_int64("ID", lease_id)
        _check_int64("TTL", ttl_s)
        if lease_id == 0:
            raise LeaseNotFoundError()  # etcd: Grant(NoLease)
        if ttl_s > MAX_LEASE_TTL_S:
            raise LeaseTTLTooLargeError()
        if ttl_s < 1:
            raise InvalidArgumentError(MSG_NEGATIVE_TTL if ttl_s < 0 else "raftkv: lease TTL 0")
        if lease_id in self._leases:
            raise LeaseExistsError()
        if len(self._leases) >= HARD_MAX_LEASES:
            raise TooManyLeasesError()
        lease = _Lease(lease_id, ttl_s, 0)
        self._leases[lease_id] = lease
        if self._primary:
            now = self.clock()
            self._set_expiry(lease, now + ttl_s)
            self._schedule_checkpoint(lease, now)
        return LeaseGrantResponse(_header(self.store), lease_id, ttl_s)

    def revoke(self, lease_id: int) -> ApplyResult:
        """etcd's Revoke: delete the attached keys (sorted, one revision; no keys: no new
        revision) and forget the lease. Raises ``LeaseNotFoundError``."""
        if lease_id not in self._leases:
            raise LeaseNotFoundError()
        events: tuple = ()
        if self.store is not None:
            events = self.store.delete_keys_of_lease(lease_id).events
        self._forget(lease_id)
        return self._result(LeaseRevokeResponse(_header(self.store)), events)

    def _forget(self, lease_id: int) -> None:
        del self._leases[lease_id]  # its heap entries are dropped lazily
        self._pending_clears.discard(lease_id)

    def checkpoint(self, checkpoints: Iterable[tuple[int, int]]) -> None:
        """etcd's Checkpoint: remember each lease's remaining TTL (0 clears it); unknown IDs
        are ignored (the lease was revoked meanwhile)."""
        now = None
        for lease_id, remaining_ttl_s in checkpoints:
            _check_int64("remaining TTL", remaining_ttl_s)
            lease = self._leases.get(lease_id)
            if lease is None:
                continue
            lease.remaining_ttl_s = max(0, remaining_ttl_s)
            if self._primary:
                if now is None:
                    now = self.clock()
                self._schedule_checkpoint(lease, now)

    def _revision(self) -> int:
        return self.store.revision if self.store is not None else 0

    def _result(self, response: Any, events: tuple = ()) -> ApplyResult:
        return ApplyResult(response, None, events, False, self._revision())

    # -----------------------------------------------------------------------------------------
    # Snapshots (replicated part only)

    def snapshot(self) -> bytes:
        """The lease table and the dedup table (``kvserver.lease.snapshot`` has the byte
        layout); equal tables give equal bytes."""
        rows = [
            (x.lease_id, x.ttl_s, x.remaining_ttl_s)
            for x in sorted(self._leases.values(), key=lambda lease: lease.lease_id)
        ]
        return encode_snapshot(rows, self._dedup.export())

    def restore(self, data: bytes | None) -> None:
        """Replace the lease and dedup tables by a ``snapshot()`` (``None``: empty; a version 1
        snapshot: empty dedup table). The role is kept: a primary gives every lease a deadline
        of now + remaining/granted TTL. Raises ``SnapshotFormatError`` and then changes
        nothing."""
        leases: dict[int, _Lease] = {}
        dedup = DedupTable(self._dedup.ids_per_client, self._dedup.max_clients)
        if data is not None:
            rows, exported = decode_snapshot(data)
            for lease_id, ttl_s, remaining_ttl_s in rows:
                leases[lease_id] = _Lease(lease_id, ttl_s, remaining_ttl_s)
            if exported is not None:
                dedup = DedupTable.from_export(
                    exported, self._dedup.ids_per_client, self._dedup.max_clients
                )
        self._leases = leases
        self._dedup = dedup
        self._expiry_heap = []
        self._checkpoint_heap = []
        self._pending_clears = set()
        if self._primary:
            self._refresh_all(0.0)

    # -----------------------------------------------------------------------------------------
    # Leader-only timing part

    def promote(self, extend_s: float) -> None:
        """Become the primary lessor: every lease expires at now + (remaining or granted TTL)
        + ``extend_s`` (pass the election timeout: a leader change never shortens a lease).
        With many leases, deadlines are then spread so that no more than 3/4 of
        ``revoke_rate_per_s`` fall in any second (etcd's pile-up avoidance); a deadline is only
        ever moved later."""
        self._primary = True
        self._refresh_all(extend_s)

    def demote(self) -> None:
        """Stop being the primary lessor: no deadlines, nothing expires, no checkpoints."""
        self._primary = False
        for lease in self._leases.values():
            lease.expiry = _FOREVER
            lease.deadline = _FOREVER
            lease.checkpoint_at = _FOREVER
        self._expiry_heap = []
        self._checkpoint_heap = []
        self._pending_clears = set()

    def keepalive(self, lease_id: int) -> int:
        """etcd's Renew: the lease now expires at now + its granted TTL; answer that TTL.
        Raises ``NotPrimaryError``, ``LeaseNotFoundError``, ``LeaseExpiredError``."""
        if not self._primary:
            raise NotPrimaryError()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError()
        now = self.clock()
        if lease.expiry <= now:
            raise LeaseExpiredError()
        if lease.remaining_ttl_s > 0:
            # The replicated remaining TTL is stale now: clear it through raft, or a new
            # leader would resume the lease from it (etcd proposes the clear inside Renew).
            self._pending_clears.add(lease_id)
        self._set_expiry(lease, now + lease.ttl_s)
        return lease.ttl_s

    def time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLiveResponse:
        """etcd's LeaseTimeToLive on the leader: remaining TTL truncated to whole seconds
        (-1 and no error for an unknown lease, as etcd answers), the granted TTL, and the
        attached keys (sorted) if ``keys``. Raises ``NotPrimaryError``."""
        if not self._primary:
            raise NotPrimaryError()
        header = _header(self.store)
        lease = self._leases.get(lease_id)
        if lease is None:
            return LeaseTimeToLiveResponse(header, lease_id, -1)
        remaining = int(lease.expiry - self.clock())  # truncates toward zero, like etcd
        attached: tuple[bytes, ...] = ()
        if keys and self.store is not None:
            attached = tuple(self.store.keys_with_lease(lease_id))
        return LeaseTimeToLiveResponse(header, lease_id, remaining, lease.ttl_s, attached)

    def remaining_s(self, lease_id: int) -> float:
        """Seconds until the lease expires here (inf when not primary). Raises
        ``LeaseNotFoundError``."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError()
        return lease.expiry - self.clock()

    def is_expired(self, lease_id: int) -> bool:
        lease = self._leases.get(lease_id)
        return lease is not None and lease.expiry <= self.clock()

    def expired(self, limit: int | None = None) -> list[int]:
        """IDs of leases whose deadline passed, soonest first, at most ``limit`` (default:
        half the revoke rate, etcd's per-round budget). The caller proposes a revoke for each;
        an ID is listed again only after ``expired_retry_interval_s`` (in case that revoke
        was lost). Empty unless primary."""
        if not self._primary:
            return []
        if limit is None:
            limit = max(1, self.revoke_rate_per_s // 2)
        now = self.clock()
        heap = self._expiry_heap
        leases = self._leases
        out: list[int] = []
        while heap and len(out) < limit:
            deadline, lease_id = heap[0]
            lease = leases.get(lease_id)
            if lease is None or lease.deadline != deadline:
                heapq.heappop(heap)  # stale: revoked, refreshed or rescheduled
                continue
            if deadline > now:
                break
            heapq.heappop(heap)
            if lease.expiry <= now:
                out.append(lease_id)
                lease.deadline = now + self.expired_retry_interval_s
            else:
                lease.deadline = lease.expiry
            heapq.heappush(heap, (lease.deadline, lease_id))
        return out

    def due_checkpoints(self, limit: int = DEFAULT_CHECKPOINT_BATCH) -> list[tuple[int, int]]:
        """``(id, remaining_ttl_s)`` pairs to replicate in one ``LeaseCheckpointRequest``:
        first the clears queued by ``keepalive`` (remaining 0), then the leases whose
        checkpoint time came (remaining rounded up; skipped, and looked at again one interval
        later, when not below the granted TTL). Empty unless primary."""
        if not self._primary:
            return []
        out: list[tuple[int, int]] = []
        for lease_id in sorted(self._pending_clears):
            if len(out) >= limit:
                break
            self._pending_clears.discard(lease_id)
            lease = self._leases.get(lease_id)
            if lease is not None and lease.remaining_ttl_s > 0:
                out.append((lease_id, 0))
        if self.checkpoint_interval_s is None:
            return out
        now = self.clock()
        heap = self._checkpoint_heap
        while heap and len(out) < limit and heap[0][0] <= now:
            when, lease_id = heapq.heappop(heap)
            lease = self._leases.get(lease_id)
            if lease is None or lease.checkpoint_at != when:
                continue  # stale: revoked or rescheduled
            lease.checkpoint_at = _FOREVER  # applying the checkpoint schedules the next one
            if lease.expiry <= now:
                continue
            remaining = math.ceil(lease.expiry - now)
            if remaining >= lease.ttl_s:
                # Refreshed meanwhile: nothing to record now, but look again next interval
                # (etcd drops the schedule here, so a lease that was refreshed once at the
                # wrong moment is never checkpointed again while this leader lasts).
                self._schedule_checkpoint(lease, now)
                continue
            out.append((lease_id, remaining))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time (on ``clock``) at which ``expired`` or ``due_checkpoints`` may
        have something new; None when nothing is scheduled (a hint for the driver's timer)."""
        if not self._primary:
            return None
        self._prune_expiry_heap_head()
        times = []
        if self._expiry_heap:
            times.append(self._expiry_heap[0][0])
        if self._checkpoint_heap:
            times.append(self._checkpoint_heap[0][0])
        if self._pending_clears:
            times.append(self.clock())
        return min(times) if times else None

    # --- internals -----------------------------------------------------------------------------

    def _refresh_all(self, extend_s: float) -> None:
        now = self.clock()
        leases = self._leases
        for lease in leases.values():
            lease.expiry = now + (lease.remaining_ttl_s or lease.ttl_s) + extend_s
        if len(leases) >= self.revoke_rate_per_s:
            self._spread_expiries()
        self._expiry_heap = []
        self._checkpoint_heap = []
        self._pending_clears = set()
        for lease in leases.values():
            lease.deadline = lease.expiry
            lease.checkpoint_at = _FOREVER
            self._expiry_heap.append((lease.expiry, lease.lease_id))
            self._schedule_checkpoint(lease, now)
        heapq.heapify(self._expiry_heap)

    def _spread_expiries(self) -> None:
        """Move deadlines later so that no more than target leases (3/4 of the revoke rate,
        leaving room for leases that expire normally) fall in one window: windows are one
        second long, disjoint, and start at the first deadline that does not fit in the
        previous one (so any second holds at most two windows' worth)."""
        target = max(1, 3 * self.revoke_rate_per_s // 4)
        order = sorted(self._leases.values(), key=lambda lease: (lease.expiry, lease.lease_id))
        prev = -_FOREVER
        window_start = -_FOREVER
        count = 0
        for lease in order:
            t = max(lease.expiry, prev)  # invariant: never earlier than the lease's deadline
            if t >= window_start + 1.0:
                window_start, count = t, 0
            elif count >= target:
                window_start += 1.0
                count = 0
                t = max(t, window_start)
            count += 1
            lease.expiry = prev = t

    def _set_expiry(self, lease: _Lease, expiry: float) -> None:
        lease.expiry = expiry
        lease.deadline = expiry
        heap = self._expiry_heap
        heapq.heappush(heap, (expiry, lease.lease_id))
        # Every refresh leaves a stale entry behind: rebuild before they dominate.
        if len(heap) > 2 * len(self._leases) + 64:
            self._expiry_heap = [
                (x.deadline, x.lease_id) for x in self._leases.values() if x.deadline < _FOREVER
            ]
            heapq.heapify(self._expiry_heap)

    def _prune_expiry_heap_head(self) -> None:
        heap = self._expiry_heap
        while heap:
            deadline, lease_id = heap[0]
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:
                return
            heapq.heappop(heap)

    def _schedule_checkpoint(self, lease: _Lease, now: float) -> None:
        """Offer a checkpoint of ``lease`` one interval from now (replacing any earlier
        schedule), if it lives longer than an interval (etcd's scheduleCheckpointIfNeeded)."""
        interval = self.checkpoint_interval_s
        if interval is None or (lease.remaining_ttl_s or lease.ttl_s) <= interval:
            return
        lease.checkpoint_at = now + interval
        heap = self._checkpoint_heap
        heapq.heappush(heap, (lease.checkpoint_at, lease.lease_id))
        if len(heap) > 2 * len(self._leases) + 64:
            self._checkpoint_heap = [
                (x.checkpoint_at, x.lease_id)
                for x in self._leases.values()
                if x.checkpoint_at < _FOREVER
            ]
            heapq.heapify(self._checkpoint_heap)
