"""One client URL for both dialects: HTTP/2 connections go to gRPC, the rest to the HTTP app.

etcd serves gRPC and its JSON gateway on the same port, and ``member list`` advertises that
one URL to both kinds of client (etcdctl's ``--cluster`` commands dial every member's client
URL over gRPC; gateway clients use the same URLs over HTTP/1.1). raftkv does the same:
``ClientPortProtocol`` is the protocol of every connection accepted on a client URL. It
looks at the first bytes the client sends (after TLS, on an https URL):

- the HTTP/2 connection preface (``PRI * HTTP/2.0...``, what every gRPC client sends first)
  hands the connection, with the bytes read so far, to the gRPC server:
  ``connection(identity)`` makes the protocol that replaces this one on the transport and
  serves the calls (``kvserver.api.grpc.connection``), in a front-end process or, in a
  member without front ends, on the member's loop. ``identity`` is the client's address
  and, on an https URL with ``--client-cert-auth``, its verified certificate's common name
  (etcd's ``AuthInfoFromTLS``);
- anything else hands the connection, with the bytes read so far, to the HTTP/1.1 protocol
  (aiohttp's request handler behind the connection guard) the same way, unless
  ``http_hand_off`` takes it elsewhere (a front end passes it to its member).

Either way, after the first packet a request costs nothing extra here. A client that sends
fewer bytes than the preface and then nothing is closed after ``SNIFF_TIMEOUT_S`` (the
header deadline of the HTTP side would not apply yet).

TLS and ALPN. The https listener's context advertises ``http/1.1`` first and then ``h2``
(``advertise_alpn``): a client that offers both (curl) gets HTTP/1.1, a gRPC client, which
offers ``h2`` only, gets HTTP/2.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol, cast

from kvserver.tls import peer_common_name

from .rpc import ClientIdentity

HandOff = Callable[[asyncio.BaseTransport, bytes], bool]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SNIFF_TIMEOUT_S = 10.0


class GrpcConnections(Protocol):
    def connection(self, identity: ClientIdentity) -> asyncio.Protocol: ...


def advertise_alpn(ctx: ssl.SSLContext) -> ssl.SSLContext:
    """Let an https client URL negotiate HTTP/2 for gRPC clients (HTTP/1.1 preferred)."""
    ctx.set_alpn_protocols(["http/1.1", "h2"])
    return ctx


def peer_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "")


class ClientPortProtocol(asyncio.Protocol):
    """The protocol of a client-URL connection until its first bytes say which dialect."""

    def __init__(
        self,
        http_factory: Callable[[], asyncio.Protocol],
        grpc_server: GrpcConnections | None,
        http_hand_off: HandOff | None = None,
    ):
        self.http_factory = http_factory
        self.grpc_server = grpc_server
        self.http_hand_off = http_hand_off
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.inner: asyncio.Protocol | None = None  # the dialect's protocol, once known
        self.grpc = False  # the dialect is HTTP/2 (gRPC)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.grpc_server is None:
            self._become_http()
            return
        self.timer = asyncio.get_running_loop().call_later(SNIFF_TIMEOUT_S, self._too_slow)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head = self.buffer[: len(H2_PREFACE)]
        if not H2_PREFACE.startswith(head):
            self._become_http()
        elif len(head) == len(H2_PREFACE):
            self._become_grpc()
        # else: a prefix of the preface so far; wait for more

    def eof_received(self) -> bool | None:
        self._cancel_timer()
        return None  # close: the client sent part of a first packet, then nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        if self.transport is not None:
            self.transport.close()

    def _become_http(self) -> None:
        transport = self.transport
        assert transport is not None
        if self.http_hand_off is not None and self.http_hand_off(transport, self.buffer):
            self._cancel_timer()
            self.buffer = b""
            return
        self._hand_over(self.http_factory())

    def _become_grpc(self) -> None:
        transport = self.transport
        assert transport is not None and self.grpc_server is not None
        who = ClientIdentity(peer_address(transport), peer_common_name(transport))
        self.grpc = True
        self._hand_over(self.grpc_server.connection(who))

    def _hand_over(self, inner: asyncio.Protocol) -> None:
        self._cancel_timer()
        transport = self.transport
        assert transport is not None
        self.inner = inner
        transport.set_protocol(inner)
        inner.connection_made(transport)
        if self.buffer and not transport.is_closing():
            inner.data_received(self.buffer)
        self.buffer = b""

    def closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def retire(self, grace_s: float) -> None:
        """Send the client elsewhere, as a server going away does: HTTP/2 gets GOAWAY and
        closes once its running calls end, HTTP/1.1 closes after the answer in progress; what
        still runs after ``grace_s`` (a Watch stream, a streamed answer) is cut, as grpc-go's
        MaxConnectionAgeGrace cuts it. The client reconnects, and meets whoever accepts now."""
        inner, transport = self.inner, self.transport
        if transport is None or transport.is_closing():
            return
        if inner is None:  # the dialect is not known yet: nothing is running
            self._cancel_timer()
            transport.close()
            return
        loop = asyncio.get_running_loop()
        if self.grpc:
            grpc_connection = cast(Leaving, inner)
            grpc_connection.go_away()
            loop.call_later(grace_s, grpc_connection.abort)
        else:
            handler = cast(LeavingHttp, inner)
            handler.close()
            loop.call_later(grace_s, handler.force_close)


class Leaving(Protocol):
    """What ``retire`` needs of a gRPC connection (``connection.GrpcConnection``)."""

    def go_away(self) -> None: ...

    def abort(self) -> None: ...


class LeavingHttp(Protocol):
    """What ``retire`` needs of an HTTP/1.1 connection (aiohttp's ``RequestHandler``)."""

    def close(self) -> None: ...

    def force_close(self) -> None: ...


def client_port_factory(
    http_factory: Callable[[], asyncio.Protocol],
    grpc_server: GrpcConnections | None,
    *,
    http_hand_off: HandOff | None = None,
) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a client URL's listener (``loop.create_server``).
    ``http_hand_off(transport, first_bytes)`` may take an HTTP/1.1 connection elsewhere (a
    front end passing it to its member); when it says False, ``http_factory`` serves it."""
    return lambda: ClientPortProtocol(http_factory, grpc_server, http_hand_off)
