"""The replicated KV service: the MVCC store as raft's state machine, served as KVService.

Writes are encoded once (``mvcc.codec.encode_entry`` with the client's request id), proposed
through the node and answered with the result this node computed when it applied the entry.
Linearizable reads wait for a ReadIndex barrier and then read the local store; serializable
reads read it at once. A range the store can answer in O(log N + a page) is answered in one
step; any other (no limit, a historical revision, a sort or a filter) is read with
``MVCCStore.range_in_steps``, a slice of keys per loop turn, at the revision current when it
started. Every response gets a full header (cluster, member, revision, term).

Leases (``kvserver.lease``): the ``Lessor`` is bound to the store (a put naming an unknown
lease fails with ``etcdserver: requested lease not found``); lease entries (``is_lease_entry``)
are applied by the lessor, everything else by the store. A snapshot is the framed lease table
(``frame_snapshot``) followed by the MVCC stream; a snapshot without the frame (from before
leases) restores an empty table. Grant and revoke are proposed through raft (a retry with the
same client/request id is answered the first outcome by the lessor's dedup table); keep-alive and
time-to-live are answered by the leader only, after a ReadIndex barrier (a deposed leader
must not refresh a lease); a follower answers ``etcdserver: not leader`` (Unavailable,
retryable: the client fails over to another member). The node calls ``on_leader_start`` when
this member's first entry as leader is applied (the lessor is promoted, every deadline
extended by one election timeout) and ``on_leader_stop`` when it loses leadership (demoted).
While primary, a task proposes a revoke for every expired lease every
``LEASE_EXPIRY_INTERVAL_S`` (and the due checkpoints, when checkpoints are enabled).

Watch (``kvserver.watch.hub``): every applied entry that produced events (a write, or a lease
revoke deleting attached keys) is passed to ``watch_hub.notify`` before anything else runs on
the loop; a snapshot restore re-points the hub at the new store (``reset``: watchers catch up
from its history, or are told it was compacted). ``watch_stream()`` opens a stream for the
HTTP layer; every member serves watches from its own applied state. Progress notifications go
out every ``WATCH_PROGRESS_INTERVAL_S``; ``stop()`` closes the hub.

Auth (``kvserver.auth``): auth entries (``is_auth_entry``) are applied by ``self.auth``
(users, roles, permissions, enabled flag, token digests). When auth state exists, a snapshot
starts with its frame (``kvserver.auth.store.frame_auth``) before the lease frame; a snapshot
without it restores the empty auth state.

Alarms and the space quota (``kvserver.server.alarms``, ``kvserver.server.quota``): alarm
entries (``is_alarm_entry``) are applied by ``self.alarms``, the same set on every member.
Before proposing a put, a txn with puts or a lease grant, ``_check_quota`` compares the
store's ``db_size_bytes`` plus the request's cost with ``quota_backend_bytes``; over it, this
member raises its NOSPACE alarm through raft (and waits for it to apply) and the request fails
with ``etcdserver: mvcc: database space exceeded``. While an alarm is raised, ``apply`` answers
the writes it refuses (``quota.refusal``) with that error instead of applying them, on every
member alike, so a write proposed before the alarm fails everywhere too. ``alarm(GET)`` is
answered from the local set after a ReadIndex barrier; ACTIVATE and DEACTIVATE are logged.
When an alarm is raised, a snapshot starts with its frame (``AlarmStore.snapshot_frame``),
before the auth frame; a snapshot without it restores no alarms.

Auto-compaction (``kvserver.server.compactor``, etcd's ``--auto-compaction-*`` flags): when the
server passes enabled settings to ``start``, a loop on every member asks its policy; only the
leader's proposes, through the ordinary ``compact`` path.

Applying a compaction is the store's logical part only (``MVCCStore`` with
``compact_in_background``): the revision is compacted for every reader at once, and a task
(one at a time, stopped by ``stop``) cuts the old versions with ``compact_step`` in batches of
``COMPACTION_BATCH_KEYS``, yielding the loop between batches, so a large compaction never
holds the loop long enough for a member to miss heartbeats. Meanwhile memory and the store's
db size (what the space quota counts) still include the versions not yet cut.
"""

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

from kvserver.auth import AuthService
from kvserver.auth.store import is_auth_entry, split_auth_frame
from kvserver.kvpb import service_errors as errors
from kvserver.kvpb.alarm import (
    AlarmAction,
    AlarmMember,
    AlarmRequest,
    AlarmResponse,
    AlarmType,
    NoSpaceError,
)
from kvserver.kvpb.errors import (
    CodecError,
    CompactedError,
    InvalidArgumentError,
    LeaseNotFoundError,
    SnapshotFormatError,
)
from kvserver.kvpb.kv import (
    ApplyResult,
    CompactionRequest,
    CompactionResponse,
    DeleteRangeRequest,
    DeleteRangeResponse,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    ResponseHeader,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.lease import (
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseKeepAliveResponse,
    LeaseLeasesResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
    LeaseTimeToLiveResponse,
)
from kvserver.kvpb.quick import replace_field
from kvserver.lease.codec import (
    LeaseCheckpointRequest,
    decode_lease_entry,
    encode_lease_entry,
    is_lease_entry,
)
from kvserver.lease.errors import LeaseExpiredError, NotPrimaryError
from kvserver.lease.lessor import DEFAULT_MIN_TTL_S, LeaseIdGenerator, Lessor
from kvserver.lease.snapshot import frame_snapshot, split_snapshot
from kvserver.membership.service import MembershipService
from kvserver.mvcc.codec import decode_entry, encode_entry
from kvserver.mvcc.hashkv import HashKVResponse, hash_kv_steps
from kvserver.mvcc.snapshot import DEFAULT_CHUNK_SIZE_BYTES, StreamLayout, read_layout
from kvserver.mvcc.store import WRITE_STEP_KEYS, MVCCStore
from kvserver.mvcc.validate import check_delete, check_put, check_range, check_txn
from kvserver.server.alarms import (
    AlarmStore,
    decode_alarm_entry,
    encode_alarm_entry,
    is_alarm_entry,
    split_alarm_frame,
)
from kvserver.server.compactor import AutoCompaction, Compactor
from kvserver.server.gc_pacer import freeze_heap
from kvserver.server.node import ApplyInSteps, NodeOptions
from kvserver.server.quota import (
    DEFAULT_QUOTA_BACKEND_BYTES,
    over_quota,
    refusal,
    request_cost,
)
from kvserver.server.service import MemberInfo, NodeStatus
from kvserver.watch.hub import WatchHub, WatchLimits, WatchStream

log = logging.getLogger(__name__)

LEASE_EXPIRY_INTERVAL_S = 0.5  # etcd's lessor loop: revoke expired leases twice a second
_EXPIRED_WAIT_STEP_S = 0.05  # keep-alive of an expired lease: poll for its revoke
WATCH_PROGRESS_INTERVAL_S = 600.0  # etcd's --experimental-watch-progress-notify-interval
COMPACTION_BATCH_KEYS = 1000  # etcd's CompactionBatchLimit
# Between two batches the loop runs whatever is ready (raft ticks and messages, requests),
# which bounds what compaction adds to any latency to one batch; and then it pauses, as
# etcd's scheduled compaction does (10 ms): with no pause the batches took half of a busy
# member's loop, and at a million keys puts waited 264 ms at p99 while they ran. The pause
# stretches the time the old versions stay in memory (about 10 s more per million keys).
DEFAULT_COMPACTION_PAUSE_S = 0.01
# A snapshot continued from the previous one builds the lease frame on the loop: above this
# many leases that frame is itself a step of milliseconds, and the whole image is made instead.
INCREMENTAL_SNAPSHOT_MAX_LEASES = 10_000
# etcd fragments a watch response over maxRequestBytes + gRPC overhead (1.5 MiB + 512 KiB).
WATCH_FRAGMENT_BYTES = 1536 * 1024 + 512 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class ImageLayout:
    """Where the store's stream starts in a snapshot image (after the alarm, auth and lease
    frames), and the stream's own layout."""

    stream_offset: int
    stream: StreamLayout

    @property
    def body_range(self) -> tuple[int, int]:
        """Where the stream's body (its base and log batches) lies in the image: the part a
        continued image copies from this one."""
        return (
            self.stream_offset + self.stream.body_start,
            self.stream_offset + self.stream.body_end,
        )


def not_leader() -> errors.ServiceError:
    """etcd's ErrGRPCNotLeader as a retryable Unavailable: the client tries another member."""
    return errors.ServiceError(
        errors.GrpcCode.UNAVAILABLE, "etcdserver: not leader", retryable=True
    )


class ConsensusNode(Protocol):
    """What the KV service asks of the raft node (``kvserver.server.node.Node``). Tests of the
    state machine alone and the point-in-time replay pass stand-ins."""

    @property
    def term(self) -> int: ...

    @property
    def leader(self) -> int: ...

    @property
    def applied(self) -> int: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def opts(self) -> NodeOptions: ...

    async def propose(self, payload: bytes) -> object: ...

    async def read_barrier(self) -> int: ...

    async def wait_recovered(self) -> None: ...

    def status(self) -> dict: ...

    def health_problem(self) -> str: ...

    def transfer_leadership(self, transferee: int) -> None: ...


def no_membership() -> errors.ServiceError:
    return errors.ServiceError(
        errors.GrpcCode.UNIMPLEMENTED, "raftkv: this service answers no member calls"
    )


class RaftKV:
    """Implements ``kvserver.server.node.StateMachine`` and ``kvserver.server.service.KVService``."""

    def __init__(
        self,
        *,
        cluster_id: int,
        member_id: int,
        name: str,
        members: tuple[MemberInfo, ...],
        node: ConsensusNode,
        membership: MembershipService | None,
        archive_lag: Callable[[], tuple[int, float]] | None = None,
        max_txn_ops: int = 128,
        election_timeout_s: float = 1.0,
        min_lease_ttl_s: int = DEFAULT_MIN_TTL_S,
        lease_checkpoint_interval_s: float | None = None,
        quota_backend_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES,
        compaction_pause_s: float = DEFAULT_COMPACTION_PAUSE_S,
        on_memory_freed: Callable[[str], None] | None = None,
    ):
        self.cluster_id = cluster_id
        self.member_id = member_id
        self.name = name
        self.members = members
        self.max_txn_ops = max_txn_ops
        self.store = MVCCStore(compact_in_background=True)
        # This member's own store proposals in flight, by entry: applied from the request
        # already in hand instead of decoding the entry again (``_write``).
        self._own_proposals: dict[bytes, tuple[int, int, Any]] = {}
        self.election_timeout_s = election_timeout_s
        self.lessor = Lessor(
            store=self.store,
            min_ttl_s=min_lease_ttl_s,
            checkpoint_interval_s=lease_checkpoint_interval_s,
        )
        self.lease_ids = LeaseIdGenerator(member_id, int(time.time() * 1000))
        self.watch_hub = WatchHub(self.store, WatchLimits(max_response_bytes=WATCH_FRAGMENT_BYTES))
        self.node = node  # proposals and read barriers (it starts with this as its state machine)
        self.membership = membership  # answers the member_* calls (None: a replay, a test)
        # () -> (entries, seconds) behind, when this member archives (--archive-url)
        self.archive_lag = archive_lag
        self._lease_task: asyncio.Task | None = None
        self.compactor: Compactor | None = None  # auto-compaction, when enabled
        self._watch_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()  # fire-and-forget revoke proposals
        self._compaction_task: asyncio.Task | None = None  # the store's physical compaction
        self.compaction_batches = 0  # compact_step calls made by that task (for tests)
        self.compaction_pause_s = compaction_pause_s  # between two batches
        # called when a compaction has cut its versions (kvserver.server.heap_trim)
        self._on_memory_freed = on_memory_freed
        # Auth (kvserver.auth): replicated users/roles; entries start with 94 41.
        self.auth = AuthService(propose=node.propose, read_barrier=node.read_barrier)
        # Alarms (kvserver.server.alarms): replicated; entries start with 94 21.
        self.alarms = AlarmStore()
        self.quota_backend_bytes = quota_backend_bytes
        self._nospace_proposal: asyncio.Task | None = None  # this member's ACTIVATE in flight

    # --- StateMachine ------------------------------------------------------------------------

    def apply(self, index: int, payload: bytes) -> object:
        if is_alarm_entry(payload):
            return self._apply_alarm(payload)
        if is_auth_entry(payload):
            return self.auth.apply_entry(payload)
        capped = bool(len(self.alarms))  # refuse what the raised alarms forbid
        if is_lease_entry(payload):
            return self._apply_lease(payload, capped)
        return self._apply_kv(payload, capped)

    def _apply_lease(self, payload: bytes, capped: bool) -> object:
        """A lease entry: refused while ``capped`` if the raised alarms forbid it; a revoke
        of a lease with many keys in steps, as a large delete."""
        try:
            client_id, request_id, req = decode_lease_entry(payload)
        except CodecError:
            return self._applied(self.lessor.apply_entry(payload))  # its decoding error
        if capped:
            error = refusal(self.alarms, req)
            if error is not None:
                return error
        if (
            type(req) is LeaseRevokeRequest
            and self.store.lease_key_count(req.lease_id) > WRITE_STEP_KEYS
        ):
            return ApplyInSteps(self._revoke_large(req, client_id, request_id))
        return self._applied(self.lessor.apply(req, client_id, request_id))

    def _revoke_large(
        self, req: LeaseRevokeRequest, client_id: int, request_id: int
    ) -> Generator[None, None, object]:
        store = self.store
        result = yield from self.lessor.revoke_in_steps(
            req, client_id, request_id, store.delete_keys_of_lease_in_steps
        )
        return self._applied(result)

    def _apply_kv(self, payload: bytes, capped: bool) -> object:
        """A store entry, decoded once: refused while ``capped`` if the raised alarms forbid
        it (the same outcome on every member); a delete of many keys in steps (deletes are
        never refused, so an operator can free space under NOSPACE)."""
        own = self._own_proposals.pop(payload, None) if type(payload) is bytes else None
        if own is not None:
            client_id, request_id, req = own
        else:
            try:
                client_id, request_id, req = decode_entry(payload)
            except CodecError:
                return self._applied(self.store.apply_entry(payload))  # the decoding error
        if capped:
            error = refusal(self.alarms, req)
            if error is not None:
                return error
        if self.store.write_is_large(req):
            return ApplyInSteps(self._apply_large(self.store, req, client_id, request_id))
        return self._applied(self.store.apply(req, client_id, request_id))

    def _applied(self, result: ApplyResult) -> object:
        """Hand an applied entry's events to the watchers; the entry's outcome."""
        if result.events:  # before anything else runs on the loop (WatchHub's contract)
            self.watch_hub.notify(result.revision, result.events)
        if type(result.response) is CompactionResponse:
            self._start_compaction()
        return result.error if result.error is not None else result.response

    def _apply_large(
        self, store: MVCCStore, req: Any, client_id: int, request_id: int
    ) -> Generator[None, None, object]:
        """A delete of many keys, in steps the node's apply task interleaves with the loop
        (``MVCCStore.apply_in_steps`` says what readers see meanwhile)."""
        result = yield from store.apply_in_steps(req, client_id, request_id)
        return self._applied(result)

    def _apply_alarm(self, payload: bytes) -> object:
        try:
            req = decode_alarm_entry(payload)
        except CodecError as err:
            return InvalidArgumentError(f"raftkv: undecodable log entry: {err}")
        changed = self.alarms.apply(req)
        if changed:
            log.warning(
                "member %x: alarm %s %s of member %x (raised now: %s)",
                self.member_id,
                req.action.name,
                req.alarm.name,
                req.member_id,
                ", ".join(f"{a.alarm.name}@{a.member_id:x}" for a in self.alarms.get()) or "none",
            )
        return AlarmResponse(ResponseHeader(revision=self.store.revision), changed)

    def snapshot_chunks(self, chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES) -> Iterator[bytes]:
        """The image at the applied index of the call: every part is taken now (the store's
        stream fixes its view now too), so applies may go on while the chunks are read."""
        return itertools.chain(self._snapshot_frames(), self.store.serialize(chunk_size_bytes))

    def _snapshot_frames(self) -> list[bytes]:
        """The alarm, auth and lease frames that come before the store's stream in an image,
        taken now (an empty alarm or auth frame is left out)."""
        frames = [
            self.alarms.snapshot_frame(),  # b"" when no alarm is raised
            self.auth.snapshot_frame(),  # b"" when auth was never used
            frame_snapshot(self.lessor.snapshot()),
        ]
        return [f for f in frames if f]

    def snapshot_chunks_after(
        self,
        prev_image: bytes | memoryview,
        prev: ImageLayout,
        chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
        on_layout: Callable[[ImageLayout], None] | None = None,
    ) -> Iterator[bytes | memoryview] | None:
        """``snapshot_chunks`` made from ``prev_image``, an earlier image of this member's
        history whose layout is ``prev`` (``snapshot_layout``): new frames, then the store's
        stream continued from the earlier one (``MVCCStore.serialize_after``), so the work
        on the caller's side is that of the changes since. ``on_layout`` gets the new
        image's layout after its last chunk: what ``snapshot_layout`` would read from it.
        None when that cannot be (a compaction since, or so many leases that their frame is
        itself a big step): the caller then makes the whole image."""
        if len(self.lessor) > INCREMENTAL_SNAPSHOT_MAX_LEASES:
            return None
        frames = self._snapshot_frames()
        stream_offset = sum(map(len, frames))

        def stream_layout(layout: StreamLayout) -> None:
            if on_layout is not None:
                on_layout(ImageLayout(stream_offset, layout))

        stream = memoryview(prev_image)[prev.stream_offset :]
        continued = self.store.serialize_after(stream, prev.stream, chunk_size_bytes, stream_layout)
        if continued is None:
            return None
        return itertools.chain(frames, continued)

    @staticmethod
    def snapshot_layout(image: bytes | memoryview) -> ImageLayout | None:
        """Where the store's stream lies in a snapshot image, and its layout; None for an
        image that ``snapshot_chunks_after`` cannot continue (an older stream format).
        Touches nothing of the member's, so it may run in a worker thread."""
        try:
            _, after_alarms = split_alarm_frame(image)
            _, after_auth = split_auth_frame(after_alarms)
            _, rest = split_snapshot(after_auth)
            return ImageLayout(len(image) - len(rest), read_layout(rest))
        except SnapshotFormatError:
            return None

    def restore(self, data: bytes | memoryview) -> None:
        """Replace the state with a snapshot image at once (a member starting up)."""
        self._install(_decode_image(data))
        # The restored store is long-lived: keep the cyclic GC from walking it again and
        # again (a full collection over a large store stalls the loop for tens of ms).
        freeze_heap()

    async def install_snapshot(self, data: bytes | memoryview) -> None:
        """Replace the state with a snapshot image from the leader while the member runs.

        The image is decoded and the new store built in a worker thread: the objects it
        builds are reachable from nowhere else until the swap, and the decode runs in small
        steps (one msgpack batch of at most 1,024 records at a time), so the interpreter
        switches back to the loop every few milliseconds and the raft task keeps its
        heartbeats. The cyclic GC is paused meanwhile: a full collection over millions of
        fresh objects would hold the interpreter for longer than any of those steps. The
        swap itself is on the loop and costs O(watchers + leases)."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            image = await asyncio.to_thread(_decode_image, data)
            self._install(image)
        finally:
            freeze_heap()
            if was_enabled:
                gc.enable()

    def _install(self, image: "_Image") -> None:
        self.alarms = image.alarms
        self.auth.restore(image.auth_blob)
        self.lessor.restore(image.lease_blob)
        self.store = image.store
        self.lessor.bind(image.store)
        self.watch_hub.reset(image.store)  # watchers continue from the new store's history

    # --- leader hooks (called by the node) and the expiry task ------------------------------

    def on_leader_start(self) -> None:
        """This member's first entry as leader is applied: everything of earlier terms is in
        the table, so the lessor may start its clock (extended: no lease expires early)."""
        self.lessor.promote(self.election_timeout_s)
        log.info("member %x: lessor promoted (%d leases)", self.member_id, len(self.lessor))

    def on_leader_stop(self) -> None:
        self.lessor.demote()

    def on_replay_start(self) -> None:
        """The node replays its log after a restart: no client reads the store until it is
        done, so new keys may wait to be put in order (``MVCCStore.defer_key_order``)."""
        self.store.defer_key_order()

    def on_replay_end(self) -> None:
        self.store.settle_key_order()

    def start(self, auto_compaction: AutoCompaction | None = None) -> None:
        self._lease_task = asyncio.get_running_loop().create_task(
            self._lease_loop(), name=f"lessor-{self.member_id:x}"
        )
        if auto_compaction is not None and auto_compaction.enabled:
            # Every member runs the loop; only the leader's proposes (kvserver.server.compactor).
            self.compactor = Compactor(
                auto_compaction,
                revision=lambda: self.store.revision,
                is_leader=lambda: self.node.is_leader,
                compact=lambda rev: self.compact(CompactionRequest(rev)),
                is_compacted_error=lambda exc: isinstance(exc, CompactedError),
            )
            self.compactor.start()
        self._watch_task = asyncio.get_running_loop().create_task(
            self._watch_progress_loop(), name=f"watch-progress-{self.member_id:x}"
        )
        self._start_compaction()  # a compaction replayed before the loop ran

    async def stop(self) -> None:
        if self.compactor is not None:
            await self.compactor.stop()
        tasks = [
            t
            for t in (self._lease_task, self._watch_task, self._compaction_task, *self._background)
            if t is not None
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._lease_task = self._watch_task = self._compaction_task = None
        self.watch_hub.close()  # every watcher: canceled, "etcdserver: server stopped"

    def _start_compaction(self) -> None:
        """Start the task that cuts the old versions of an applied compaction, unless it runs
        already (it picks up the new work: the store merges it) or there is nothing to do."""
        if self._compaction_task is not None or not self.store.compaction_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # applied outside a loop (a replay): ``start`` picks it up
            return
        self._compaction_task = loop.create_task(
            self._compaction_loop(), name=f"compaction-{self.member_id:x}"
        )

    async def _compaction_loop(self) -> None:
        """etcd's scheduled compaction: batches of ``COMPACTION_BATCH_KEYS``, the loop free in
        between. The store is read anew per batch: a restore replaces it by one that is fully
        compacted, which ends the work."""
        try:
            while True:
                self.compaction_batches += 1
                if not self.store.compact_step(COMPACTION_BATCH_KEYS):
                    if self._on_memory_freed is not None:
                        self._on_memory_freed("compacted")
                    return
                await asyncio.sleep(self.compaction_pause_s)
        finally:
            self._compaction_task = None

    async def _watch_progress_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_PROGRESS_INTERVAL_S)
            self.watch_hub.progress_tick()

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(LEASE_EXPIRY_INTERVAL_S)
            if not self.node.is_leader or not self.lessor.is_primary:
                continue
            for lease_id in self.lessor.expired():
                self._propose_in_background(LeaseRevokeRequest(lease_id))
            checkpoints = self.lessor.due_checkpoints()
            if checkpoints:
                self._propose_in_background(LeaseCheckpointRequest(tuple(checkpoints)))

    def _propose_in_background(self, req) -> None:
        task = asyncio.get_running_loop().create_task(self._propose_quietly(req))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _propose_quietly(self, req) -> None:
        try:
            await self.node.propose(encode_lease_entry(req))
        except Exception as exc:  # lost: ``expired`` lists the lease again after a while
            log.debug("lease proposal %s failed: %s", req, exc)

    # --- KVService ---------------------------------------------------------------------------

    def _header(self, revision: int) -> ResponseHeader:
        return ResponseHeader(self.cluster_id, self.member_id, revision, self.node.term)

    def _finish(self, response):
        return replace_field(response, "header", self._header(response.header.revision))

    async def range(self, req: RangeRequest) -> RangeResponse:
        check_range(req)
        if req.serializable:
            await self.node.wait_recovered()  # never older than before a restart
        else:
            await self.node.read_barrier()
        store = self.store
        if store.range_is_bounded(req):
            result = store.apply(req)
            if result.error is not None:
                raise result.error
            return self._finish(result.response)
        # A range that may visit every key in it (no limit, a historical revision, a sort, a
        # filter) is read a slice of keys per loop turn, so it never holds the loop.
        steps = store.range_in_steps(req)
        try:
            answer = next(steps)
            while answer is None:
                await asyncio.sleep(0)
                answer = next(steps)
        finally:
            steps.close()
        return self._finish(answer)

    async def _write(self, req, client_id: int, request_id: int):
        payload = encode_entry(req, client_id, request_id)
        # Applied here from ``req`` itself: decoding the entry would rebuild an equal request
        # (the codec round-trips exactly; other members decode it), at a cost that grows with
        # the request, about a sixth of this member's CPU for txns of 127 puts.
        self._own_proposals[payload] = (client_id, request_id, req)
        try:
            result = await self.node.propose(payload)
        finally:
            self._own_proposals.pop(payload, None)  # still there: dropped, never applied
        return self._finish(result)

    async def _check_quota(self, req) -> None:
        """etcd's quota check before a proposal: over the quota, raise this member's NOSPACE
        alarm (once applied here, every member refuses such writes) and refuse ``req``."""
        if not over_quota(self.store.db_size_bytes, request_cost(req), self.quota_backend_bytes):
            return
        mine = AlarmMember(self.member_id, AlarmType.NOSPACE)
        if mine not in self.alarms.get(AlarmType.NOSPACE):
            if self._nospace_proposal is None or self._nospace_proposal.done():
                log.warning(
                    "member %x: database space exceeded (%d bytes, quota %d): raising NOSPACE",
                    self.member_id,
                    self.store.db_size_bytes,
                    self.quota_backend_bytes,
                )
                self._nospace_proposal = asyncio.get_running_loop().create_task(
                    self._propose_quietly_alarm(AlarmAction.ACTIVATE, AlarmType.NOSPACE)
                )
            await asyncio.shield(self._nospace_proposal)
        raise NoSpaceError()

    async def _propose_quietly_alarm(self, action: AlarmAction, alarm: AlarmType) -> None:
        try:
            await self.node.propose(encode_alarm_entry(AlarmRequest(action, self.member_id, alarm)))
        except Exception as exc:  # the next refused write proposes it again
            log.warning("member %x: alarm proposal failed: %s", self.member_id, exc)

    async def put(self, req: PutRequest, *, client_id: int = 0, request_id: int = 0) -> PutResponse:
        check_put(req)  # refuse bad input before it reaches the log
        await self._check_quota(req)
        return await self._write(req, client_id, request_id)

    async def delete_range(
        self, req: DeleteRangeRequest, *, client_id: int = 0, request_id: int = 0
    ) -> DeleteRangeResponse:
        check_delete(req)
        return await self._write(req, client_id, request_id)

    async def txn(self, req: TxnRequest, *, client_id: int = 0, request_id: int = 0) -> TxnResponse:
        check_txn(req, self.max_txn_ops)
        await self._check_quota(req)
        return await self._write(req, client_id, request_id)

    async def compact(self, req: CompactionRequest) -> CompactionResponse:
        return await self._write(req, 0, 0)

    # --- leases ------------------------------------------------------------------------------

    async def lease_grant(
        self, ttl_s: int, lease_id: int = 0, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseGrantResponse:
        # A retry (pair already applied here) is proposed anyway: the apply answers it the
        # first outcome (the lessor's dedup table), whatever ID this proposal carries.
        await self._check_quota(LeaseGrantRequest(ttl_s, lease_id))
        req = self.lessor.prepare_grant(
            LeaseGrantRequest(ttl_s, lease_id),
            self.lease_ids,
            client_id=client_id,
            request_id=request_id,
        )
        resp = await self.node.propose(encode_lease_entry(req, client_id, request_id))
        return self._finish(resp)

    async def lease_revoke(
        self, lease_id: int, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseRevokeResponse:
        resp = await self.node.propose(
            encode_lease_entry(LeaseRevokeRequest(lease_id), client_id, request_id)
        )
        return self._finish(resp)

    async def _ensure_primary(self) -> None:
        """Leader only, and still the leader (ReadIndex), and the lessor promoted."""
        if not self.node.is_leader:
            raise not_leader()
        await self.node.read_barrier()
        if not self.node.is_leader or not self.lessor.is_primary:
            raise not_leader()

    async def lease_keepalive(self, lease_id: int) -> LeaseKeepAliveResponse:
        await self._ensure_primary()
        deadline = time.monotonic() + self.node.opts.request_timeout_s
        while True:
            try:
                ttl_s = self.lessor.keepalive(lease_id)
                break
            except NotPrimaryError:
                raise not_leader() from None
            except LeaseExpiredError:
                # Its revoke is in flight (etcd's Renew waits for it): answer not found once
                # it is applied, "not leader" if this member is demoted meanwhile.
                if time.monotonic() >= deadline:
                    raise errors.timed_out() from None
                await asyncio.sleep(_EXPIRED_WAIT_STEP_S)
                if not self.lessor.exists(lease_id):
                    raise LeaseNotFoundError() from None
        return LeaseKeepAliveResponse(self._header(self.store.revision), lease_id, ttl_s)

    async def lease_time_to_live(
        self, lease_id: int, keys: bool = False
    ) -> LeaseTimeToLiveResponse:
        await self._ensure_primary()
        try:
            resp = self.lessor.time_to_live(lease_id, keys)
        except NotPrimaryError:
            raise not_leader() from None
        return self._finish(resp)

    async def lease_leases(self) -> LeaseLeasesResponse:
        # Linearizable like a default range (etcd answers from the local lessor): a follower
        # must not list leases, and a header revision, older than a write already
        # acknowledged elsewhere (the differential test against etcd caught one behind).
        await self.node.read_barrier()
        return self._finish(self.lessor.leases())

    # --- alarms ------------------------------------------------------------------------------

    async def alarm(self, req: AlarmRequest) -> AlarmResponse:
        """etcd's Maintenance.Alarm: GET lists the raised alarms of ``req.alarm`` (``NONE``:
        all) as of a ReadIndex barrier; ACTIVATE and DEACTIVATE go through the log and answer
        the pair they changed (nothing when there was nothing to change)."""
        if req.action == AlarmAction.GET:
            await self.node.read_barrier()
            return self._finish(
                AlarmResponse(
                    ResponseHeader(revision=self.store.revision), self.alarms.get(req.alarm)
                )
            )
        resp = await self.node.propose(encode_alarm_entry(req))
        return self._finish(resp)

    # --- maintenance -------------------------------------------------------------------------

    async def hash_kv(self, revision: int = 0) -> HashKVResponse:
        """etcd's Maintenance.HashKV: this member's hash of its keyspace up to ``revision``
        (0: its current revision), from its applied state and without a barrier (members are
        compared with each other, as etcd's are), computed a chunk of the store per loop turn
        (``kvserver.mvcc.hashkv`` says what is hashed)."""
        steps = hash_kv_steps(self.store, revision)
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return self._finish(done.value)
                await asyncio.sleep(0)
        finally:
            steps.close()

    async def move_leader(self, transferee: int) -> None:
        """etcd's Maintenance.MoveLeader: on the leader, hand leadership to ``transferee`` and
        return once this member sees it lead. etcd's errors: ``etcdserver: not leader`` on any
        other member and ``etcdserver: bad leader transferee`` for a member that is not a
        voter (both FailedPrecondition); ``etcdserver: request timed out, leader transfer took
        too long`` (Unavailable) if it has not happened within the request timeout."""
        node = self.node
        if not node.is_leader:
            raise errors.ServiceError(errors.GrpcCode.FAILED_PRECONDITION, "etcdserver: not leader")
        if transferee not in node.status()["voters"]:
            raise errors.ServiceError(
                errors.GrpcCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee"
            )
        if transferee == self.member_id:
            return  # etcd: done once the transferee leads, which it does
        loop = asyncio.get_running_loop()
        deadline = loop.time() + node.opts.request_timeout_s
        ask_at = loop.time()
        while node.leader != transferee:  # etcd polls once per tick as well
            now = loop.time()
            if now >= deadline:
                raise errors.ServiceError(
                    errors.GrpcCode.UNAVAILABLE,
                    "etcdserver: request timed out, leader transfer took too long",
                )
            if now >= ask_at:
                # Asked again after an election timeout: raft gives a transfer up when the
                # transferee has not caught up by then (etcd asks once and times out).
                node.transfer_leadership(transferee)
                ask_at = now + self.election_timeout_s
            await asyncio.sleep(node.opts.heartbeat_interval_s)
        log.info("member %x: leadership moved to %x", self.member_id, transferee)

    # --- watch -------------------------------------------------------------------------------

    @property
    def raft_term(self) -> int:
        return self.node.term

    def watch_stream(self, max_watchers: int | None = None) -> WatchStream:
        return self.watch_hub.open_stream(max_watchers)

    async def wait_recovered(self) -> None:
        """Local reads and new watches wait until a restarted member has re-applied what it
        had committed (its in-memory store would otherwise be older than before)."""
        await self.node.wait_recovered()

    # --- membership (kvserver.membership.service.MembershipService answers) ------------------------

    def _members(self) -> MembershipService:
        if self.membership is None:
            raise no_membership()
        return self.membership

    async def member_list(self):
        return await self._members().member_list()

    async def member_add(self, peer_urls, is_learner: bool = False):
        return await self._members().member_add(peer_urls, is_learner)

    async def member_remove(self, member_id: int):
        return await self._members().member_remove(member_id)

    async def member_promote(self, member_id: int):
        return await self._members().member_promote(member_id)

    async def member_update(self, member_id: int, peer_urls):
        return await self._members().member_update(member_id, peer_urls)

    def status(self) -> NodeStatus:
        node = self.node
        st = node.status()
        is_learner = self.member_id in st["learners"]
        lag = self.archive_lag() if self.archive_lag is not None else (None, None)
        return NodeStatus(
            member_id=self.member_id,
            cluster_id=self.cluster_id,
            name=self.name,
            leader=node.leader,
            raft_term=node.term,
            raft_index=st["committed"],
            raft_applied_index=node.applied,
            revision=self.store.revision,
            compact_revision=self.store.compact_revision,
            db_size_bytes=self.store.db_size_bytes,
            quota_backend_bytes=self.quota_backend_bytes,
            errors=tuple(
                f"memberID:{a.member_id} alarm:{a.alarm.name} " for a in self.alarms.get()
            ),
            is_learner=is_learner,
            members=self.members,
            problem=node.health_problem(),
            archive_lag_entries=lag[0],
            archive_lag_seconds=lag[1],
        )


@dataclasses.dataclass(frozen=True)
class _Image:
    """A decoded snapshot image, built apart from the running state."""

    alarms: AlarmStore
    auth_blob: bytes | None
    lease_blob: bytes | None
    store: MVCCStore


def _decode_image(data: bytes | memoryview) -> _Image:
    """Decode a snapshot image (alarm, auth and lease frames, then the MVCC stream); touches
    nothing shared, so it may run in a worker thread."""
    alarm_blob, after_alarms = split_alarm_frame(data)  # absent: no alarm raised
    auth_blob, after_auth = split_auth_frame(after_alarms)  # absent: empty auth state
    lease_blob, rest = split_snapshot(after_auth)
    return _Image(
        alarms=AlarmStore.restore(alarm_blob),
        auth_blob=auth_blob,
        lease_blob=lease_blob,
        store=MVCCStore.restore(_slices(rest), compact_in_background=True),
    )


def _slices(view: memoryview, size: int = 1 << 20) -> Iterator[bytes]:
    # Copied a MiB at a time: one copy of a whole image would hold the interpreter for as
    # long as a memcpy of hundreds of megabytes takes.
    for start in range(0, len(view), size):
        yield bytes(view[start : start + size])
