"""Prometheus metrics of one raftkv node: HTTP latency plus numbers the node driver reports.

Contract
--------
``Metrics`` owns its own ``prometheus_client.CollectorRegistry`` (no process globals, so
several nodes can live in one process, as in tests). It exposes:

- ``raftkv_http_request_duration_seconds{dialect,route,status}`` — a histogram recorded by
  ``Metrics.http_middleware()`` (an aiohttp middleware) for every request. ``dialect`` is
  ``etcd`` (``/v3/...``, ``/v3beta/...``), ``rest`` (``/v1/...``) or ``ops`` (``/health``,
  ``/metrics``, ``/version``); ``route`` is the matched route's pattern (``/v1/kv/{key}``), or
  ``unmatched`` — never the raw path, so label cardinality stays bounded.
- the node's own numbers, read on every scrape from a callable (the *node stats source*).
- the standard ``process_*`` metrics (CPU, memory, open fds).

The node stats hook
-------------------
The driver hands over a zero-argument callable returning a mapping; ``Metrics`` calls it once
per scrape, on the scraping thread (the event loop thread when served by our HTTP app), so
the callable must be cheap and must not block. Keys are the names in ``NODE_METRICS`` below;
unknown keys are ignored (so a newer driver works with an older table) and a missing key is
simply not exported. Values:

- a number (int/float) for gauges and counters (counters are cumulative totals since start);
- a ``Mapping[label_value, number]`` for the metrics that have a label (``peer`` for
  ``peer_send_failures``), one sample per entry;
- a ``DurationHistogram`` (defined here) for histograms: the driver keeps one, calls
  ``observe(seconds)`` from whatever thread does the work (the WAL writer thread for fsyncs),
  and returns the object itself in the mapping.

The driver's whole part, therefore::

    fsync_hist = DurationHistogram(FSYNC_BUCKETS_SECONDS)   # writer thread: observe(dt)
    metrics.node_stats = lambda: {
        "raft_term": node.term, "raft_commit_index": node.commit, ...,
        "wal_fsync_duration_seconds": fsync_hist,
    }

If the callable raises, the scrape still succeeds: the node metrics are left out, the error
is logged, and ``raftkv_node_stats_errors_total`` counts it.

Exported names: ``raftkv_`` + the key, with ``_total`` appended to counters by the exposition
format (so key ``proposals_committed`` becomes ``raftkv_proposals_committed_total``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

from raft import MessageType

_MSG_APP = MessageType.MsgApp
_MSG_HEARTBEAT = MessageType.MsgHeartbeat

log = logging.getLogger(__name__)

# HTTP request latency buckets: a loopback request takes ~0.1-2 ms, a write waits for a
# quorum fsync, a linearizable read for a ReadIndex round; timeouts are seconds.
HTTP_BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# fdatasync on the target machine takes ~0.15 ms, a slow disk tens of ms: 100 us * 2^i.
FSYNC_BUCKETS_SECONDS = tuple(0.0001 * 2**i for i in range(16))  # 100 us .. 3.3 s


class MetricKind(Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class NodeMetricSpec:
    kind: MetricKind
    help: str
    label: str | None = None  # label name when the value is a mapping


G, C, H = MetricKind.GAUGE, MetricKind.COUNTER, MetricKind.HISTOGRAM

# The keys a node stats source may return (see the module docstring).
NODE_METRICS: Mapping[str, NodeMetricSpec] = {
    "raft_term": NodeMetricSpec(G, "Current raft term of this node."),
    "raft_commit_index": NodeMetricSpec(G, "Highest raft log index known to be committed."),
    "raft_applied_index": NodeMetricSpec(G, "Highest raft log index applied to the store."),
    "raft_apply_lag_entries": NodeMetricSpec(
        G, "Committed entries not yet applied (commit index - applied index)."
    ),
    "raft_has_leader": NodeMetricSpec(G, "1 when this node knows a leader, else 0."),
    "raft_is_leader": NodeMetricSpec(G, "1 when this node is the leader, else 0."),
    "raft_leader_changes": NodeMetricSpec(
        C, "Changes of the leader this node knows, losing it (no leader) included."
    ),
    "raft_leader_changes_seen": NodeMetricSpec(
        C,
        "Times this node learned of a new leader (etcd's leader_changes_seen: losing the "
        "leader is not counted, so an election counts once).",
    ),
    "raft_follower_lag_entries": NodeMetricSpec(
        G,
        "On the leader, per follower: committed entries the follower has not acknowledged "
        "(commit index - its match index, 0 when it has them all); absent on followers.",
        label="peer",
    ),
    "proposals_committed": NodeMetricSpec(C, "Proposals committed (applied) via this node."),
    "proposals_failed": NodeMetricSpec(C, "Proposals that failed (dropped, timed out, no leader)."),
    "proposals_pending": NodeMetricSpec(G, "Proposals waiting to be committed."),
    "wal_fsync_duration_seconds": NodeMetricSpec(
        H, "Latency of WAL fsyncs (count = number of fsyncs)."
    ),
    "disk_fsync_p99_seconds": NodeMetricSpec(
        G,
        "p99 of this member's WAL fsyncs over --slow-disk-window (an fsync in flight counts "
        "with its age): what the slow-disk leader transfer judges.",
    ),
    "disk_stalled_seconds": NodeMetricSpec(
        G, "How long the WAL fsync in flight has been waiting (0: none is)."
    ),
    "slow_disk_leader_transfers": NodeMetricSpec(
        C,
        "Leadership transfers this member started because its own WAL fsyncs were slow and a "
        "caught-up follower's were not (--slow-disk-transfer).",
    ),
    "disk_stalls": NodeMetricSpec(
        C, "Times a WAL fsync waited past --disk-stall-timeout (/health false meanwhile)."
    ),
    "peer_send_failures": NodeMetricSpec(
        C, "Messages to a peer that could not be sent.", label="peer"
    ),
    "store_revision": NodeMetricSpec(G, "Current MVCC store revision."),
    "store_db_size_bytes": NodeMetricSpec(
        G,
        "Encoded size of the store's live data plus its uncompacted history (what the space "
        "quota counts; not process memory).",
    ),
    "quota_backend_bytes": NodeMetricSpec(G, "The space quota (--quota-backend-bytes) in bytes."),
    "store_compaction_pending_versions": NodeMetricSpec(
        G,
        "Versions below the compact revision whose keys the background compaction has yet to "
        "visit (0: the last compaction's old versions are all gone).",
    ),
    "alarm_active": NodeMetricSpec(
        G, "1 while some member has raised this alarm (NOSPACE, CORRUPT), else 0.", label="alarm"
    ),
    "raft_append_messages_sent": NodeMetricSpec(
        C,
        "MsgApp messages handed to the peer transport (entries per message = "
        "raft_append_entries_sent / raft_append_messages_sent).",
    ),
    "raft_append_entries_sent": NodeMetricSpec(
        C, "Log entries carried by the MsgApp messages handed to the peer transport."
    ),
    "raft_heartbeats_sent": NodeMetricSpec(
        C,
        "MsgHeartbeat messages handed to the peer transport: one per follower each heartbeat "
        "interval, and one per follower for each round of linearizable reads a leader runs.",
    ),
    "archive_lag_entries": NodeMetricSpec(
        G, "WAL entries written locally but not yet in the archive (--archive-url)."
    ),
    "archive_lag_seconds": NodeMetricSpec(
        G, "How long the archive has been behind the local WAL (0 when caught up)."
    ),
    "archive_uploaded_bytes": NodeMetricSpec(C, "Bytes uploaded to the archive."),
    "archive_errors": NodeMetricSpec(C, "Archive passes that failed (retried)."),
    "gc_full_passes": NodeMetricSpec(C, "Full (generation 2) passes of Python's cyclic GC."),
    "snapshot_streams_refused": NodeMetricSpec(
        C, "Snapshot streams refused: --max-snapshot-streams were running."
    ),
    "loop_stall_seconds": NodeMetricSpec(
        H,
        "How late the event loop ran a task that asked to sleep 20 ms: time the loop (and raft's "
        "ticks and heartbeats on it) was held by other work.",
    ),
    "loop_longest_stall_seconds": NodeMetricSpec(
        G, "The longest event-loop stall since the member started."
    ),
    "gc_freezes": NodeMetricSpec(
        C, "Times a slow full GC pass was followed by gc.freeze() (kvserver.server.gc_pacer)."
    ),
    "gc_longest_full_pass_seconds": NodeMetricSpec(
        G, "The longest full GC pass since the member started (it holds the event loop)."
    ),
    "heap_trims": NodeMetricSpec(
        C,
        "Times freed heap memory was handed back to the OS (malloc_trim) after a snapshot, "
        "a compaction or an installed snapshot dropped much data (kvserver.server.heap_trim).",
    ),
    "heap_trim_seconds": NodeMetricSpec(C, "Time spent in those trims, in a worker thread."),
    "snapshot_fork_seconds": NodeMetricSpec(
        H,
        "How long each snapshot's fork took: the event loop waits while the page tables of "
        "the whole process are copied (it grows with the member's memory).",
    ),
    "snapshots_made": NodeMetricSpec(
        C,
        "Snapshots this member made and kept, by how: continued (the previous snapshot's "
        "file copied and the changes since appended, no fork), child (a forked child), loop "
        "(on the event loop).",
        label="how",
    ),
}


class DurationHistogram:
    """A fixed-bucket duration histogram a worker thread feeds and a scrape reads.

    ``observe`` is a bisect and two additions under an uncontended lock (well under a
    microsecond), so it is cheap enough for every fsync. ``bounds_seconds`` are the upper
    bounds of the finite buckets, ascending; an implicit ``+Inf`` bucket follows.
    """

    __slots__ = ("bounds_seconds", "_counts", "_sum", "_lock")

    def __init__(self, bounds_seconds: Iterable[float] = FSYNC_BUCKETS_SECONDS) -> None:
        bounds = tuple(float(b) for b in bounds_seconds)
        if not bounds or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
            raise ValueError("histogram bounds must be non-empty and strictly ascending")
        self.bounds_seconds = bounds
        self._counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); last is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect_left(self.bounds_seconds, seconds)  # bucket with le >= seconds
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative buckets ``[(le, count), ..., ("+Inf", total)]`` and the sum."""
        with self._lock:
            counts = list(self._counts)
            total_sum = self._sum
        out = []
        acc = 0
        for bound, n in zip(self.bounds_seconds, counts, strict=False):
            acc += n
            out.append((_float_label(bound), acc))
        out.append(("+Inf", acc + counts[-1]))
        return out, total_sum

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)


def _float_label(x: float) -> str:
    return repr(float(x))


class NodeStats(TypedDict, total=False):
    """The mapping a node stats source returns (every key optional; see ``NODE_METRICS``)."""

    raft_term: int
    raft_commit_index: int
    raft_applied_index: int
    raft_apply_lag_entries: int
    raft_has_leader: int
    raft_is_leader: int
    raft_leader_changes: int
    raft_leader_changes_seen: int
    raft_follower_lag_entries: Mapping[int | str, int]
    proposals_committed: int
    proposals_failed: int
    proposals_pending: int
    wal_fsync_duration_seconds: DurationHistogram
    disk_fsync_p99_seconds: float
    disk_stalled_seconds: float
    slow_disk_leader_transfers: int
    disk_stalls: int
    peer_send_failures: Mapping[int | str, int]
    store_revision: int
    store_db_size_bytes: int
    quota_backend_bytes: int
    store_compaction_pending_versions: int
    alarm_active: Mapping[str, int]
    raft_append_messages_sent: int
    raft_append_entries_sent: int
    raft_heartbeats_sent: int
    archive_lag_entries: int
    archive_lag_seconds: float
    archive_uploaded_bytes: int
    archive_errors: int
    gc_full_passes: int
    snapshot_streams_refused: int
    loop_stall_seconds: DurationHistogram
    loop_longest_stall_seconds: float
    gc_freezes: int
    gc_longest_full_pass_seconds: float
    heap_trims: int
    heap_trim_seconds: float
    snapshot_fork_seconds: DurationHistogram
    snapshots_made: Mapping[str, int]


class AppendCounter:
    """Counts the MsgApp messages (and the entries in them) a node sends: batching made
    visible; and its MsgHeartbeats, which also carry its rounds of linearizable reads.

    ``wrap(send)`` returns ``send`` preceded by the count (one pass over each Ready's
    messages, a type check apiece); ``stats()`` gives the two ``NODE_METRICS`` counters.
    Fsyncs per committed entry need no new counter: ``wal_fsync_duration_seconds``'s count
    over ``raft_commit_index``.
    """

    __slots__ = ("messages", "entries", "heartbeats")

    def __init__(self) -> None:
        self.messages = 0
        self.entries = 0
        self.heartbeats = 0

    def count(self, messages: Iterable[Any]) -> None:
        for m in messages:
            kind = m.type
            if kind == _MSG_APP:
                self.messages += 1
                self.entries += len(m.entries)
            elif kind == _MSG_HEARTBEAT:
                self.heartbeats += 1

    def wrap(self, send: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        count = self.count

        def counted_send(messages: list[Any]) -> None:
            count(messages)
            send(messages)

        return counted_send

    def stats(self) -> dict[str, int]:
        return {
            "raft_append_messages_sent": self.messages,
            "raft_append_entries_sent": self.entries,
            "raft_heartbeats_sent": self.heartbeats,
        }


NodeStatsSource = Callable[[], Mapping[str, Any]]  # returns a NodeStats


class _NodeStatsCollector:
    """Turns the node stats mapping into metric families at scrape time."""

    def __init__(self, owner: Metrics) -> None:
        self._owner = owner

    def describe(self) -> list[Metric]:
        return []  # names are dynamic; nothing to pre-register

    def collect(self) -> Iterable[Metric]:
        source = self._owner.node_stats
        if source is None:
            return []
        try:
            stats = source()
            return list(_families(stats))
        except Exception:
            log.exception("node stats source failed; node metrics left out of this scrape")
            self._owner.node_stats_errors.inc()
            return []


def _families(stats: Mapping[str, Any]) -> Iterable[Metric]:
    for key, value in stats.items():
        spec = NODE_METRICS.get(key)
        if spec is None or value is None:
            continue
        name = "raftkv_" + key
        if spec.kind is MetricKind.HISTOGRAM:
            buckets, total = value.snapshot()
            yield HistogramMetricFamily(name, spec.help, buckets=buckets, sum_value=total)
            continue
        labels = [spec.label] if spec.label else None
        if spec.kind is MetricKind.COUNTER:
            fam: CounterMetricFamily | GaugeMetricFamily = CounterMetricFamily(
                name, spec.help, labels=labels
            )
        else:
            fam = GaugeMetricFamily(name, spec.help, labels=labels)
        if spec.label:
            for label_value, v in value.items():
                fam.add_metric([str(label_value)], float(v))
        else:
            fam.add_metric([], float(value))
        yield fam


def _dialect(path: str) -> str:
    if path.startswith("/v3/") or path.startswith("/v3beta/"):
        return "etcd"
    if path.startswith("/v1/"):
        return "rest"
    return "ops"


class Metrics:
    """The metrics of one node (see the module docstring)."""

    def __init__(
        self, node_stats: NodeStatsSource | None = None, *, process_metrics: bool = True
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.node_stats: NodeStatsSource | None = node_stats
        self.http_request_duration = Histogram(
            "raftkv_http_request_duration_seconds",
            "Latency of client HTTP requests, from routing to response, by API dialect, "
            "route pattern and status code.",
            ("dialect", "route", "status"),
            buckets=HTTP_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.node_stats_errors = Counter(
            "raftkv_node_stats_errors",
            "Scrapes whose node stats source raised (node metrics were left out).",
            registry=None,
        )
        # The node collector first, so a scrape's own source failure shows in that scrape.
        self.registry.register(_NodeStatsCollector(self))
        self.registry.register(self.node_stats_errors)
        if process_metrics:
            ProcessCollector(registry=self.registry)
        # (dialect, route, status) -> the labelled child's observe; bounded by routes x statuses
        self._observers: dict[tuple[str, str, int], Callable[[float], None]] = {}

    def observe_http(self, dialect: str, route: str, status: int, seconds: float) -> None:
        key = (dialect, route, status)
        observe = self._observers.get(key)
        if observe is None:
            child = self.http_request_duration.labels(dialect, route, str(status))
            observe = self._observers[key] = child.observe
        observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def http_middleware(self) -> Callable[..., Any]:
        """An aiohttp middleware recording ``raftkv_http_request_duration_seconds``.

        Put it outermost, so it sees the status the error middleware rendered. A request the
        client abandoned (the handler was cancelled) is recorded with status 499.
        """
        labels_by_resource: dict[int, tuple[str, str]] = {}
        observe_http = self.observe_http
        perf_counter = time.perf_counter

        @web.middleware
        async def record_latency(request: web.Request, handler: Any) -> web.StreamResponse:
            start = perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            except asyncio.CancelledError:
                status = 499
                raise
            finally:
                resource = request.match_info.route.resource
                if resource is None:
                    labels = (_dialect(request.path), "unmatched")
                else:
                    labels = labels_by_resource.get(id(resource))  # type: ignore[assignment]
                    if labels is None:
                        canonical = resource.canonical
                        labels = labels_by_resource[id(resource)] = (_dialect(canonical), canonical)
                observe_http(labels[0], labels[1], status, perf_counter() - start)

        return record_latency
