"""Client connections passed from a front-end process to its member, and the relay of TLS ones.

A front end accepts every connection of its member's client URLs (``kvserver.api.grpc
.frontend``). It serves gRPC itself; an HTTP/1.1 connection (the JSON gateway, REST, the
dashboard, ``/health``, ``/metrics``) goes to the member, which serves HTTP:

- **plain TCP**: the socket itself, with the bytes read so far, crosses the hand-off socket
  (a ``SOCK_SEQPACKET`` pair, ``SCM_RIGHTS``): ``send_connection``. The member then serves
  it exactly as if it had accepted it, at no cost per request;
- **TLS**: a TLS session cannot move between processes, so the front end keeps it and
  relays its plaintext: it makes a socket pair, sends one end across the same way with a
  first line naming the client (``RAFTKV-RELAY <address> <certificate CN or ->``), and
  copies bytes between the client and its own end (``Relay``). The member reads the line
  and serves the rest as HTTP over a transport that reports the client's address and
  verified certificate (``RelayedTransport``), so auth by certificate works unchanged. Only
  a front end holds the hand-off socket, so nobody else can claim to relay a client.

``ConnectionReceiver`` is the member's end: it takes each socket, serves it with the HTTP
protocol, and feeds it the bytes the front end read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from kvserver.tls import peer_common_name

from .mux import peer_address

log = logging.getLogger(__name__)

# First bytes and the relay line, in one hand-off message: a front end's first read of a
# connection can be a quarter of a MiB (a request with its body), and a plain connection
# whose first read does not fit is relayed instead of passed whole.
MAX_MESSAGE_BYTES = 512 * 1024
RELAY_PREFIX = b"RAFTKV-RELAY "
PLAIN, RELAYED = b"P", b"R"
RELAY_HIGH_WATER = 256 * 1024  # bytes one side of a relay buffers before the other pauses


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """A hand-off channel: a ``SOCK_SEQPACKET`` pair whose buffers hold a whole message
    (the kernel's default, about 200 KiB, may not; root may raise it past the system's cap)."""
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in pair:
        for option, forced in ((socket.SO_SNDBUF, 32), (socket.SO_RCVBUF, 33)):
            try:  # SO_SNDBUFFORCE / SO_RCVBUFFORCE (Linux, root), else the capped option
                sock.setsockopt(socket.SOL_SOCKET, forced, 2 * MAX_MESSAGE_BYTES)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, option, 2 * MAX_MESSAGE_BYTES)
    return pair


def send_connection(channel: socket.socket, sock: socket.socket, message: bytes) -> bool:
    """Sends ``sock`` across ``channel`` with ``message``; False if it could not go (the
    channel is full or closed, or the message too long)."""
    if len(message) > MAX_MESSAGE_BYTES:
        return False
    try:
        socket.send_fds(channel, [message], [sock.fileno()])
    except OSError:
        return False
    return True


def hand_off_plain(channel: socket.socket, transport: asyncio.BaseTransport, first: bytes) -> bool:
    """Passes a plain-TCP client connection to the member; False if it stays here."""
    sock = transport.get_extra_info("socket")
    if sock is None or not send_connection(channel, sock, PLAIN + first):
        return False
    # The member holds the connection now; dropping our descriptor does not end it (no
    # shutdown, and the socket lives on in the other process).
    transport.pause_reading()  # type: ignore[attr-defined]
    transport.abort()  # type: ignore[attr-defined]
    return True


class Prefed(asyncio.Protocol):
    """Gives ``inner`` the connection, then the bytes read before it arrived here."""

    def __init__(self, inner: asyncio.Protocol, first: bytes, wrap: Any = None):
        self.inner = inner
        self.first = first
        self.wrap = wrap  # makes the transport ``inner`` sees (RelayedTransport), if any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_protocol(self.inner)
        self.inner.connection_made(self.wrap(transport) if self.wrap else transport)
        first, self.first = self.first, b""
        if first and not transport.is_closing():
            self.inner.data_received(first)


class RelayedTransport:
    """A member's end of a relayed TLS connection, as the HTTP app sees it: the client's
    address and certificate instead of the socket pair's."""

    def __init__(self, transport: asyncio.BaseTransport, address: str, common_name: str | None):
        self._transport = transport
        host, _, port = address.rpartition(":")
        self._peername = (host, int(port)) if port.isdigit() else address
        self._peercert = (
            {"subject": ((("commonName", common_name),),)} if common_name is not None else None
        )

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peername
        if name == "peercert":
            return self._peercert
        if name in ("sslcontext", "ssl_object"):
            return default  # the member holds no TLS session: the front end does
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def parse_relay_line(data: bytes) -> tuple[str, str | None, bytes] | None:
    """(address, certificate CN or None, the bytes after the line), or None if malformed."""
    line, sep, rest = data.partition(b"\n")
    if not sep or not line.startswith(RELAY_PREFIX):
        return None
    fields = line[len(RELAY_PREFIX) :].decode("utf-8", "replace").split(" ")
    if len(fields) != 2:
        return None
    address, name = fields
    return address, (None if name == "-" else name), rest


def relay_line(address: str, common_name: str | None) -> bytes:
    name = (common_name or "-").replace(" ", "_").replace("\n", "_")
    return RELAY_PREFIX + f"{address.replace(' ', '_')} {name}\n".encode()


class ConnectionReceiver:
    """The member's end of a front end's hand-off socket: serves each connection that
    arrives on it with ``protocol()`` (the HTTP app's protocol)."""

    def __init__(self, channel: socket.socket, protocol: Callable[[], asyncio.Protocol]):
        self.channel = channel
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.received = 0
        channel.setblocking(False)
        self.loop.add_reader(channel.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.channel, MAX_MESSAGE_BYTES, 4)
            except BlockingIOError:
                return
            except OSError:
                self.stop()
                return
            if not fds:
                if not data:
                    self.stop()  # the front end closed its end
                    return
                continue
            for extra in fds[1:]:  # one socket a message: more is not ours to keep
                socket.socket(fileno=extra).close()
            sock = socket.socket(fileno=fds[0])
            sock.setblocking(False)
            protocol = self._protocol_for(data)
            if protocol is None:
                log.warning("a front end sent a connection with a malformed first message")
                sock.close()
                continue
            self.received += 1
            task = self.loop.create_task(
                self.loop.connect_accepted_socket(lambda p=protocol: p, sock)  # type: ignore[misc]
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _protocol_for(self, data: bytes) -> asyncio.Protocol | None:
        kind, body = data[:1], data[1:]
        if kind == PLAIN:
            return Prefed(self.protocol(), body)
        if kind == RELAYED:
            parsed = parse_relay_line(body)
            if parsed is None:
                return None
            address, name, rest = parsed
            return Prefed(self.protocol(), rest, lambda t: RelayedTransport(t, address, name))
        return None

    def stop(self) -> None:
        try:
            self.loop.remove_reader(self.channel.fileno())
        except (ValueError, OSError):
            pass


def start_relay(
    channel: socket.socket, client: RelayedClient, address: str, common_name: str | None
) -> bool:
    """Sends the member one end of a new socket pair for ``client`` and serves the other end
    here with ``client.relay``; False if the member could not take it."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        first, client.pending = bytes(client.pending), bytearray()
        if not send_connection(channel, there, RELAYED + relay_line(address, common_name) + first):
            here.close()
            return False
    finally:
        there.close()
    here.setblocking(False)
    loop = asyncio.get_running_loop()
    relay = client.relay
    loop.create_task(loop.connect_accepted_socket(lambda: relay, here))
    return True


class Relay(asyncio.Protocol):
    """A front end's end of the socket pair of one relayed client (``RelayedClient``)."""

    def __init__(self, client: RelayedClient):
        self.client = client
        self.member: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.member = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(RELAY_HIGH_WATER)  # type: ignore[attr-defined]
        self.client.member_ready()

    def data_received(self, data: bytes) -> None:  # from the member
        client = self.client.transport
        if client is not None and not client.is_closing():
            client.write(data)

    def eof_received(self) -> bool | None:
        client = self.client.transport
        if client is not None and client.can_write_eof() and not client.is_closing():
            client.write_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        client = self.client.transport
        if client is not None and not client.is_closing():
            client.close()

    def pause_writing(self) -> None:  # the member reads slower than the client sends
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()


class RelayedClient(asyncio.Protocol):
    """A TLS client whose HTTP/1.1 the front end relays to its member: what it sends goes to
    the member as it is decrypted, what the member answers goes back, each side pausing the
    other past ``RELAY_HIGH_WATER`` bytes unwritten; either side closing closes the other.
    The member's end goes across ``channel`` (``start_relay``) as the client connects."""

    def __init__(self, channel: socket.socket):
        self.channel = channel
        self.pending = bytearray()  # what arrived before the member's end was ready
        self.relay = Relay(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(RELAY_HIGH_WATER)  # type: ignore[attr-defined]
        address, name = peer_address(transport), peer_common_name(transport)
        if not start_relay(self.channel, self, address, name):
            transport.close()

    def member_ready(self) -> None:
        member = self.relay.member
        if self.pending and member is not None:
            member.write(bytes(self.pending))
            self.pending.clear()
        if self.transport is not None and self.transport.is_closing() and member is not None:
            member.close()

    def data_received(self, data: bytes) -> None:
        member = self.relay.member
        if member is None:
            self.pending += data
            if len(self.pending) > RELAY_HIGH_WATER and self.transport is not None:
                self.transport.pause_reading()  # resumed when the member reads (resume_writing)
            return
        if not member.is_closing():
            member.write(data)

    def eof_received(self) -> bool | None:
        member = self.relay.member
        if member is not None and member.can_write_eof() and not member.is_closing():
            member.write_eof()
            return True  # keep our side open: the answer may still come
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        member = self.relay.member
        if member is not None and not member.is_closing():
            member.close()

    def pause_writing(self) -> None:  # the client reads slower than the member answers
        if self.relay.member is not None:
            self.relay.member.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.member is not None:
            self.relay.member.resume_reading()
