"""What the HTTP/2 state machine (``kvserver.api.grpc.h2_machine``) tells its application.

``H2Machine.receive_data(data)`` returns these events, in the order the peer's frames caused
them. They are plain records: the machine has already updated its own state (stream states,
windows, budgets) and queued any frames the protocol itself answers with (SETTINGS and PING
acknowledgements, RST_STREAM for a stream error, GOAWAY for a connection error); the
application decides everything above HTTP/2 (which calls run, what they answer).

``StreamState`` names a stream's states as RFC 9113 section 5.1 does. A server that never
pushes never enters the two reserved states; they are named so the table is whole.
"""

from __future__ import annotations

import enum


class StreamState(enum.Enum):
    IDLE = "idle"
    RESERVED_LOCAL = "reserved (local)"
    RESERVED_REMOTE = "reserved (remote)"
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    CLOSED = "closed"


class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        names: tuple[str, ...] = self.__slots__
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__name__}({fields})"


class RequestReceived(Event):
    """The peer opened ``stream_id`` with this header list (``end_stream``: and sent no body)."""

    __slots__ = ("stream_id", "headers", "end_stream")

    def __init__(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool):
        self.stream_id = stream_id
        self.headers = headers
        self.end_stream = end_stream


class DataReceived(Event):
    """Request bytes of ``stream_id`` (padding removed). They count toward the connection's
    input budget until the application releases them (``H2Machine.release_input``) or the
    stream closes; the stream's window is credited back when the application says so
    (``H2Machine.acknowledge_received_data``)."""

    __slots__ = ("stream_id", "data", "end_stream")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool):
        self.stream_id = stream_id
        self.data = data
        self.end_stream = end_stream


class InputBudgetExceeded(Event):
    """DATA on ``stream_id`` would have put more request bytes in the application's hands
    than the input budget allows: it was dropped, and so is every later DATA of the stream.
    The application should end the call (a gRPC server: RESOURCE_EXHAUSTED)."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int):
        self.stream_id = stream_id


class StreamEnded(Event):
    """The peer half-closed ``stream_id`` with a HEADERS frame (trailers). END_STREAM on DATA
    or on the opening HEADERS is carried by those events' ``end_stream``."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int):
        self.stream_id = stream_id


class StreamReset(Event):
    """``stream_id`` is closed by a reset: the peer's RST_STREAM (``remote``), or ours for a
    stream error the peer made (the RST_STREAM with ``error_code`` is queued)."""

    __slots__ = ("stream_id", "error_code", "remote")

    def __init__(self, stream_id: int, error_code: int, remote: bool):
        self.stream_id = stream_id
        self.error_code = error_code
        self.remote = remote


class WindowOpened(Event):
    """The peer gave ``stream_id`` more send window; 0: the connection's window grew or its
    settings changed, so any stream may send more."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int):
        self.stream_id = stream_id


class PingAcked(Event):
    """The peer answered one of our PINGs."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


class GoAwayReceived(Event):
    """The peer sent GOAWAY: it opens no more streams; the machine refuses any it still does."""

    __slots__ = ("error_code", "last_stream_id")

    def __init__(self, error_code: int, last_stream_id: int):
        self.error_code = error_code
        self.last_stream_id = last_stream_id


class ConnectionTerminated(Event):
    """The peer broke the protocol or a budget: GOAWAY with ``error_code`` is queued and the
    machine reads nothing more. Always the only event of its ``receive_data`` call (what came
    before it in the same bytes is moot: every stream ends with the connection)."""

    __slots__ = ("error_code", "message", "budget")

    def __init__(self, error_code: int, message: str, budget: str | None):
        self.error_code = error_code
        self.message = message
        self.budget = budget
