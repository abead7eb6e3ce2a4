"""One client URL for both dialects: HTTP/2 connections go to gRPC, the rest to the HTTP app.

etcd serves gRPC and its JSON gateway on the same port, and ``member list`` advertises that
one URL to both kinds of client (etcdctl's ``--cluster`` commands dial every member's client
URL over gRPC; gateway clients use the same URLs over HTTP/1.1). raftkv does the same:
``ClientPortProtocol`` is the protocol of every connection accepted on a client URL. It
looks at the first bytes the client sends (after TLS, on an https URL):

- the HTTP/2 connection preface (``PRI * HTTP/2.0...``, what every gRPC client sends first)
  makes the connection a **splice** to this member's gRPC server, which listens on a unix
  socket in Linux's abstract namespace (``GrpcBackend``; no file, and no TCP port taken from
  the range other listeners and tests pick theirs from): bytes are copied both ways, and
  either side closing closes the other;
  Flow control is the transports' own: a side whose write buffer passes its high-water mark
  pauses reading on the other side until it drains;
- anything else hands the connection, with the bytes read so far, to the HTTP/1.1 protocol
  (aiohttp's request handler behind the connection guard): it replaces this protocol on
  the transport, so after the first packet an HTTP request costs nothing extra here.

A client that sends fewer bytes than the preface and then nothing is closed after
``SNIFF_TIMEOUT_S`` (the header deadline of the HTTP side would not apply yet).

Identity. Each splice binds its end of the unix connection to a fresh abstract name before it
connects, and gRPC reports that name as the call's peer (``unix-abstract:NAME``).
``GrpcBackend.identity(peer)`` maps it back to the client's address and, on an https URL with
``--client-cert-auth``, its verified certificate's common name (etcd's ``AuthInfoFromTLS``).
A connection to the backend that did not come through a splice has no identity, and the gRPC
server refuses its calls: the TLS and client-certificate checks of the client URL cannot be
bypassed by dialling the backend (a name is registered only while its splice holds it).

TLS and ALPN. The https listener's context advertises ``http/1.1`` first and then ``h2``
(``advertise_alpn``): a client that offers both (curl) gets HTTP/1.1, a gRPC client, which
offers ``h2`` only, gets HTTP/2.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from kvserver.tls import peer_common_name

log = logging.getLogger(__name__)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SNIFF_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who is at the far end of a spliced gRPC connection."""

    address: str  # "host:port" of the client
    cert_common_name: str | None  # the verified client certificate's CN, if any


def advertise_alpn(ctx: ssl.SSLContext) -> ssl.SSLContext:
    """Let an https client URL negotiate HTTP/2 for gRPC clients (HTTP/1.1 preferred)."""
    ctx.set_alpn_protocols(["http/1.1", "h2"])
    return ctx


def _address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "")


class GrpcBackend:
    """Where spliced connections go (the gRPC server's abstract unix socket), and who they
    are."""

    def __init__(self) -> None:
        tag = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.name = f"raftkv-grpc-{tag}"  # the gRPC server listens here
        self._splice_prefix = f"raftkv-splice-{tag}-"
        self._splices = itertools.count(1)
        self._by_name: dict[str, ClientIdentity] = {}
        self.spliced = 0  # connections spliced so far (for /metrics and tests)

    @property
    def target(self) -> str:
        """The gRPC address of the backend (``add_insecure_port``, a channel)."""
        return f"unix-abstract:{self.name}"

    @property
    def open_splices(self) -> int:
        return len(self._by_name)

    def identity(self, grpc_peer: str) -> ClientIdentity | None:
        """The client behind ``context.peer()`` (``unix-abstract:NAME``), or None when the
        connection did not come through a splice."""
        kind, _, name = grpc_peer.partition(":")
        return self._by_name.get(name) if kind == "unix-abstract" else None

    def _next_name(self) -> str:
        return self._splice_prefix + str(next(self._splices))

    def _register(self, name: str, who: ClientIdentity) -> None:
        self._by_name[name] = who
        self.spliced += 1

    def _unregister(self, name: str) -> None:
        self._by_name.pop(name, None)


class _BackendSide(asyncio.Protocol):
    """The splice's connection to the gRPC server."""

    def __init__(self, splice: _Splice):
        self.splice = splice

    def data_received(self, data: bytes) -> None:
        self.splice.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.splice.close()

    def pause_writing(self) -> None:
        self.splice.client.pause_reading()

    def resume_writing(self) -> None:
        self.splice.client.resume_reading()


class _Splice(asyncio.Protocol):
    """The client's connection once it spoke HTTP/2: copies bytes to and from the backend."""

    def __init__(self, client: asyncio.Transport, backend: GrpcBackend, first: bytes):
        self.client = client
        self.backend = backend
        self.pending: list[bytes] = [first]  # client bytes read before the backend connected
        self.upstream: asyncio.Transport | None = None
        self.name: str | None = None  # this splice's abstract name, while registered
        self.closed = False
        client.pause_reading()  # until the backend connection is up
        self.task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        name = self.backend._next_name()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)  # what gRPC will report as the peer
            sock.setblocking(False)
            await loop.sock_connect(sock, "\0" + self.backend.name)
            upstream, _ = await loop.create_unix_connection(lambda: _BackendSide(self), sock=sock)
        except OSError as exc:
            sock.close()
            log.warning("the gRPC backend refused a connection: %s", exc)
            self.close()
            return
        if self.closed:
            upstream.close()
            return
        self.upstream = upstream  # type: ignore[assignment]
        self.name = name
        who = ClientIdentity(_address(self.client), peer_common_name(self.client))
        self.backend._register(name, who)
        upstream.write(b"".join(self.pending))
        self.pending = []
        self.client.resume_reading()

    def data_received(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None:
            self.pending.append(data)
            return
        upstream.write(data)

    def eof_received(self) -> bool | None:
        if self.upstream is not None and self.upstream.can_write_eof():
            self.upstream.write_eof()
            return True  # keep the client side open for the rest of the answers
        self.close()
        return None

    def pause_writing(self) -> None:  # the client reads slowly: stop reading the backend
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.name is not None:
            self.backend._unregister(self.name)
        if self.upstream is not None:
            self.upstream.close()
        self.client.close()


class ClientPortProtocol(asyncio.Protocol):
    """The protocol of a client-URL connection until its first bytes say which dialect."""

    def __init__(self, http_factory: Callable[[], asyncio.Protocol], backend: GrpcBackend | None):
        self.http_factory = http_factory
        self.backend = backend
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.backend is None:
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
        self._cancel_timer()
        transport = self.transport
        assert transport is not None
        inner = self.http_factory()
        transport.set_protocol(inner)
        inner.connection_made(transport)
        if self.buffer and not transport.is_closing():
            inner.data_received(self.buffer)
        self.buffer = b""

    def _become_grpc(self) -> None:
        self._cancel_timer()
        transport = self.transport
        assert transport is not None and self.backend is not None
        splice = _Splice(transport, self.backend, self.buffer)
        transport.set_protocol(splice)
        self.buffer = b""


def client_port_factory(
    http_factory: Callable[[], asyncio.Protocol], backend: GrpcBackend | None
) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a client URL's listener (``loop.create_server``)."""
    return lambda: ClientPortProtocol(http_factory, backend)
