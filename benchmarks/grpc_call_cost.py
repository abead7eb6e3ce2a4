"""CPU per unary gRPC call through the HTTP/2 server (``GrpcConnection``), without sockets.

    .venv/bin/python benchmarks/grpc_call_cost.py
    .venv/bin/python benchmarks/grpc_call_cost.py --root /path/to/another/checkout

Feeds one in-memory connection packets of Put calls (HEADERS and DATA per call, 1, 16 and
64 calls a packet, as clients' calls meet in one read), runs the loop until every answer is
written, and prints the process CPU time per call (the best of ``--rounds`` rounds of 20
packets). Two servers:

- ``handler``: a handler that answers at once: the server's HTTP/2 and gRPC framing, the
  call's handler and the answer's write, the put path above raft;
- ``front end``: a client front end's method table (``MemberLink``) and a member faked on
  the link that answers every call of a loop turn in the next one: what a front end spends
  per call, its link events included (not the sockets). Each call carries a new
  ``grpc-timeout``, as a Go client's do, so no two header blocks repeat.

Where ``make`` compiled the HTTP/2 modules (``kvserver/native.py``), they run compiled;
``RAFTKV_NATIVE=0`` runs them from source, to compare the two. Each line says which ran.

Process CPU time, not wall time, so a busy machine changes it less; compare two checkouts in
alternation (``--root``) rather than with numbers taken at another time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = "/etcdserverpb.KV/Put"
FIELDS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PATH),
    (":authority", "x"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-timeout", "5S"),
]


class _Transport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class _FakeMember:
    """The front end's link socket: every CALL of a loop turn is answered in the next."""

    def __init__(self, loop: asyncio.AbstractEventLoop, link: object) -> None:
        from kvserver.api.grpc import frontend_wire as wire
        from kvserver.etcdpb import rpc_pb2

        self.wire = wire
        self.loop = loop
        self.link = link
        self.unpacker = wire.unpacker()
        self.packer = wire.msgpack.Packer(use_bin_type=True)
        self.answer = rpc_pb2.PutResponse().SerializeToString()
        self.replies: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.unpacker.feed(data)
        for event in self.unpacker:
            if event[0] == self.wire.CALL:
                if not self.replies:
                    self.loop.call_soon(self._reply)
                self.replies.append(self.packer.pack((self.wire.REPLY, event[1], self.answer)))

    def _reply(self) -> None:
        data = b"".join(self.replies)
        self.replies.clear()
        self.link.data_received(data)  # type: ignore[attr-defined]

    def is_closing(self) -> bool:
        return False


async def _measure(batch: int, rounds: int, front_end: bool) -> float:
    from hpack import Encoder

    from kvserver.api.grpc import h2
    from kvserver.api.grpc.connection import GrpcConnection, ServerSettings
    from kvserver.api.grpc.frontend import MemberLink
    from kvserver.api.grpc.rpc import UNARY_UNARY, ClientIdentity, Method
    from kvserver.etcdpb import rpc_pb2

    async def put(request: object, context: object) -> rpc_pb2.PutResponse:
        return rpc_pb2.PutResponse()

    if front_end:
        link = MemberLink(asyncio.get_running_loop())
        link.connection_made(_FakeMember(asyncio.get_running_loop(), link))  # type: ignore[arg-type]
        methods = link.methods({PATH: UNARY_UNARY})
    else:
        methods = {PATH: Method(put, rpc_pb2.PutRequest)}
    settings = ServerSettings(
        methods,
        max_receive=4 * 1024 * 1024,
        keepalive_min_time=5.0,
        keepalive_interval=7200.0,
        keepalive_timeout=20.0,
    )
    conn = GrpcConnection(settings, ClientIdentity("127.0.0.1:9", None))
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    conn.data_received(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    encoder = Encoder()
    message = rpc_pb2.PutRequest(key=b"k" * 16, value=b"v" * 256).SerializeToString()
    body = b"\x00" + struct.pack(">I", len(message)) + message
    sid = 1
    best = float("inf")
    for _ in range(rounds):
        packets = []
        for _ in range(20):
            parts = []
            for _ in range(batch):
                fields = FIELDS
                if front_end:
                    fields = [*FIELDS[:-1], ("grpc-timeout", f"{4_999_000 - sid}u")]
                parts.append(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, encoder.encode(fields)))
                parts.append(h2.frame(h2.DATA, h2.END_STREAM, sid, body))
                sid += 2
            packets.append(b"".join(parts))
        start = time.process_time()
        for packet in packets:
            conn.data_received(packet)
            # the calls' tasks (and the member's answers), then the flush of their answers,
            # and the calls held back by the running-calls budget
            for _ in range(3 + (8 if front_end else 0) * (1 + batch // 32)):
                await asyncio.sleep(0)
        conn.data_received(h2.window_update(0, 20 * batch * 64))  # as a client credits
        best = min(best, (time.process_time() - start) / (20 * batch))
    if conn.streams:
        raise RuntimeError(f"{len(conn.streams)} calls were not answered")
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=ROOT, help="the checkout whose kvserver to measure")
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.root))
    import uvloop

    from kvserver import native

    form = "compiled" if native.compiled() else "source"
    for name, front_end in (("handler", False), ("front end", True)):
        cells = [
            f"{b}/packet {uvloop.run(_measure(b, args.rounds, front_end)):.1f} us"
            for b in (1, 16, 64)
        ]
        print(f"{args.root} ({form}): CPU per call, {name}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
