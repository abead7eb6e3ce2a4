"""What one client connection may make a member hold: the HTTP/2 server's budgets.

Every resource a client can make the server keep has a bound here (``Http2Limits``, one
flag each in ``kvserver.server.config``), and every time a client meets one, a counter in
``BudgetCounts`` moves (``raftkv_client_budget_exceeded_total{budget=...}`` in /metrics).
Over a bound the client gets HTTP/2's or gRPC's own answer and nobody else notices:

=========================  ==================================================================
budget                     over it
=========================  ==================================================================
``streams``                a new stream is refused (RST_STREAM REFUSED_STREAM). A stream the
                           client reset keeps its slot until its handler has ended.
``resets``                 GOAWAY ENHANCE_YOUR_CALM: more stream resets than
                           ``max_resets_per_s`` (a bucket of two seconds' worth), the answer
                           grpc-go and nginx give to rapid reset
``header_block``           GOAWAY ENHANCE_YOUR_CALM: a header block (with its CONTINUATIONs)
                           longer than ``max_header_block_bytes`` before decoding
``header_list``            GOAWAY COMPRESSION_ERROR: a block that decodes to more than
                           ``max_header_list_bytes`` (RFC 7541's size: name + value + 32)
``table_updates``          GOAWAY COMPRESSION_ERROR: a block that starts with more than two
                           dynamic-table size updates (RFC 7541 4.2 allows two)
``control_frames``         GOAWAY ENHANCE_YOUR_CALM: more than ``max_control_answers`` SETTINGS
                           or PING answers queued while the client does not read
``output``                 more than ``max_output_bytes`` of answers buffered for the client:
                           no new call starts and, when the socket's buffer is what is full,
                           nothing more is read; a connection still over it after
                           ``drain_timeout_s`` ends with GOAWAY ENHANCE_YOUR_CALM
``input``                  request bytes received that no call has taken yet: past
                           ``max_input_bytes`` the call whose bytes cross it ends with
                           RESOURCE_EXHAUSTED; the connection's receive window (credited back
                           as bytes arrive) is as large, and a client that sends past it gets
                           GOAWAY FLOW_CONTROL_ERROR
``idle``                   GOAWAY NO_ERROR after ``idle_timeout_s`` with no call open (clients
                           reconnect when they next need to)
``deadline``               a unary call sent without a deadline gets ``default_call_timeout_s``
                           (DEADLINE_EXCEEDED after it)
``connections``            GOAWAY ENHANCE_YOUR_CALM at once for a connection past
                           ``max_connections`` in this process
``connections_per_address`` the same past ``max_connections_per_address`` from one client IP
``running``                at most ``max_running_calls`` unary calls of one connection run at
                           once; the others wait their turn (streams are bounded by
                           ``streams`` and wait in their writes for the output budget). An answer is made whole before it is
                           sent, so this, with the output budget, bounds what a burst of
                           calls whose answers nobody reads can make the server hold
=========================  ==================================================================

The budgets on what a client sends (``streams``, ``resets``, ``header_block``,
``header_list``, ``table_updates``, ``control_frames``, ``input``) are enforced by the
HTTP/2 state machine (``kvserver.api.grpc.h2_machine``), which needs no socket or clock of
its own to be tested; those that need a timer or the socket's buffer (``output``, ``idle``,
``deadline``, ``running``, the connection counts) by ``kvserver.api.grpc.connection``. The
calls a front end may have in flight at its member are bounded where the member reads the
link (``kvserver.api.grpc.frontend_link``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Http2Limits:
    max_concurrent_streams: int = 1000  # etcd's --max-concurrent-streams
    max_resets_per_s: float = 200.0
    max_header_block_bytes: int = 256 * 1024
    max_header_list_bytes: int = 64 * 1024
    header_table_bytes: int = 4096  # the HPACK table we keep for the client (RFC 7541's default)
    decode_cache_bytes: int = 64 * 1024
    max_control_answers: int = 1000
    max_output_bytes: int = 8 * 1024 * 1024
    drain_timeout_s: float = 30.0
    max_input_bytes: int = 16 * 1024 * 1024
    idle_timeout_s: float = 300.0
    default_call_timeout_s: float = 60.0
    max_running_calls: int = 32
    max_connections: int = 10_000  # gRPC connections one process serves
    max_connections_per_address: int = 1000  # ... from one client IP address


BUDGETS = (
    "streams",
    "resets",
    "header_block",
    "header_list",
    "table_updates",
    "control_frames",
    "output",
    "input",
    "idle",
    "deadline",
    "running",
    "connections",
    "connections_per_address",
    "calls_in_flight",
    "watchers",  # a front end's watchers per stream or in all (kvserver.api.grpc.watch_fanout)
    "watch_backlog",  # a front end's Watch stream with too much unread: a watcher canceled
)


class BudgetCounts(Counter[str]):
    """How often clients met each budget (keys from ``BUDGETS``)."""


class ResetBucket:
    """A token bucket of stream resets: ``rate`` a second, up to two seconds' worth saved.
    Time is given (``now``, in seconds of any monotonic clock): the bucket reads no clock."""

    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, now: float):
        self.rate = rate
        self.capacity = max(1.0, 2 * rate)
        self.tokens = self.capacity
        self.stamp = now

    def take(self, now: float) -> bool:
        """One reset at ``now``; False once the client has reset more than its budget."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
