"""``raftkv bench --protocol grpc``: the workloads as etcd's ``KV`` gRPC calls (grpc.aio).

``GrpcWorkload`` turns a sequence number into one ``Call`` (the request kind, the ``KVStub``
method, the message) with the same keys and values as the HTTP workload (``Keys``): ``put``
is ``Put``, ``range`` is ``Range`` (``serializable`` with ``--consistency s``), ``txn-put``
is ``Txn`` with ``--txn-ops`` puts in ``success``, ``mixed`` picks one of the first two.

``GrpcTransport`` is the runner's transport for one load process: ``--conns`` channels (each
its own TCP connection: channels normally share one connection per target, a local
subchannel pool keeps them apart), client ``i`` calling on channel ``i % conns``, channel
``j`` going to endpoint ``j % len(endpoints)``; the calls of a channel are multiplexed on
its HTTP/2 connection. ``connect`` waits until every channel is ready (not measured).
Each call has ``--timeout`` as its deadline and carries ``--user``'s token as the ``token``
metadata (etcd's name for it); a call that ends with status OK is a success, any other
status is the error ``gRPC <CODE>: <details>``, counted like an HTTP error answer. Nothing
here is raftkv's: the generated stubs of ``kvserver.etcdpb`` speak to etcd just the same.
``https://`` endpoints use TLS with ``--cacert``/``--cert``/``--key``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc

from kvserver.bench.result import BenchError
from kvserver.bench.workloads import BenchOptions, Keys, parse_endpoint
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc

# a distinct local subchannel pool per channel: one TCP connection per --conns
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


@dataclass(frozen=True, slots=True)
class Call:
    kind: str  # "put", "range" or "txn": which stats it lands in
    method: str  # the KVStub method: "Put", "Range" or "Txn"
    message: Any


class GrpcWorkload(Keys):
    """Builds the calls of one client process."""

    def __init__(self, opts: BenchOptions, stream: int, streams: int) -> None:
        super().__init__(opts, stream, streams)
        self.next: Callable[[int], Call] = {
            "put": self._put,
            "range": self._range,
            "txn-put": self._txn,
            "mixed": self._mixed,
        }[opts.op]

    def _put(self, seq: int) -> Call:
        key = self.key(self.key_number(seq))
        return Call("put", "Put", rpc_pb2.PutRequest(key=key, value=self.value))

    def _range(self, seq: int) -> Call:
        key = self.key(self.key_number(seq))
        msg = rpc_pb2.RangeRequest(key=key, serializable=self._serializable)
        return Call("range", "Range", msg)

    def _txn(self, seq: int) -> Call:
        first = self.key_number(seq)
        ks = self.o.key_space_size
        ops = [
            rpc_pb2.RequestOp(
                request_put=rpc_pb2.PutRequest(key=self.key((first + j) % ks), value=self.value)
            )
            for j in range(self.o.txn_ops)
        ]
        return Call("txn", "Txn", rpc_pb2.TxnRequest(success=ops))

    def _mixed(self, seq: int) -> Call:
        return self._range(seq) if self.is_read() else self._put(seq)


def error_text(exc: grpc.aio.AioRpcError) -> str:
    """A short, stable text for a failed call (the error distribution's key)."""
    code = exc.code()
    details = exc.details() or ""
    return f"gRPC {code.name if code is not None else '?'}" + (
        f": {details[:100]}" if details else ""
    )


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(url: str, opts: BenchOptions) -> grpc.aio.Channel:
    """A channel to the client URL ``url`` (TLS for https, with the bench's files)."""
    host, port = parse_endpoint(url)
    target = f"{host}:{port}"
    if urlsplit(url).scheme == "https":
        try:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(opts.cacert),
                private_key=_read(opts.key),
                certificate_chain=_read(opts.cert),
            )
        except OSError as exc:
            raise BenchError(f"TLS files: {exc}") from None
        return grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


async def _ready(channel: grpc.aio.Channel, url: str) -> None:
    """Until ``channel`` is connected; ``BenchError`` as soon as a connection attempt fails
    (nothing listens, or the server does not speak HTTP/2), not at the timeout."""
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise BenchError(f"cannot connect: {url} does not answer gRPC")
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)


class GrpcTransport:
    """The runner's transport over gRPC (see the module docstring)."""

    def __init__(
        self, opts: BenchOptions, index: int, procs: int, conns: int, endpoints: list[str]
    ) -> None:
        self.timeout_s = opts.timeout_s
        self.metadata = (("token", opts.token),) if opts.token else None
        self.urls = [endpoints[(index + j * procs) % len(endpoints)] for j in range(conns)]
        self.opts = opts
        self.channels: list[grpc.aio.Channel] = []
        self.stubs: list[rpc_pb2_grpc.KVStub] = []
        self.workloads = [GrpcWorkload(opts, index, procs) for _ in range(conns)]

    async def connect(self) -> None:
        for url in self.urls:
            channel = open_channel(url, self.opts)
            self.channels.append(channel)
            self.stubs.append(rpc_pb2_grpc.KVStub(channel))
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(_ready(c, u) for c, u in zip(self.channels, self.urls, strict=True))
                ),
                self.timeout_s,
            )
        except TimeoutError:
            raise BenchError(
                f"cannot connect: no gRPC connection to {', '.join(sorted(set(self.urls)))} "
                f"within {self.timeout_s:g} s"
            ) from None

    async def send(self, ci: int, seq: int) -> tuple[str, float | None, str | None]:
        j = ci % len(self.stubs)
        call = self.workloads[j].next(seq)
        method = getattr(self.stubs[j], call.method)
        started = time.monotonic()
        try:
            await method(call.message, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            return call.kind, None, error_text(exc)
        return call.kind, time.monotonic() - started, None

    def expire(self, now: float) -> None:
        pass  # every call carries its own deadline

    async def close(self) -> None:
        channels, self.channels = self.channels, []
        await asyncio.gather(*(c.close() for c in channels))
