"""CPU per unary gRPC call through the HTTP/2 server (``GrpcConnection``), without sockets.

    .venv/bin/python benchmarks/grpc_call_cost.py
    .venv/bin/python benchmarks/grpc_call_cost.py --root /path/to/another/checkout

Feeds one in-memory connection packets of Put calls (HEADERS and DATA per call, 1, 16 and
64 calls a packet, as clients' calls meet in one read) to a handler that answers at once,
runs the loop until every answer is written, and prints the process CPU time per call (the
best of ``--rounds`` rounds of 20 packets). What it measures is the server's HTTP/2 and
gRPC framing, the call's task and the answer's write: the put path above raft. Process CPU
time, not wall time, so a busy machine changes it less; compare two checkouts in
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


async def _measure(batch: int, rounds: int) -> float:
    from hpack import Encoder

    from kvserver.api.grpc import h2
    from kvserver.api.grpc.connection import GrpcConnection, ServerSettings
    from kvserver.api.grpc.rpc import ClientIdentity, Method
    from kvserver.etcdpb import rpc_pb2

    async def put(request: object, context: object) -> rpc_pb2.PutResponse:
        return rpc_pb2.PutResponse()

    settings = ServerSettings(
        {PATH: Method(put, rpc_pb2.PutRequest)},
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
                parts.append(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, encoder.encode(FIELDS)))
                parts.append(h2.frame(h2.DATA, h2.END_STREAM, sid, body))
                sid += 2
            packets.append(b"".join(parts))
        start = time.process_time()
        for packet in packets:
            conn.data_received(packet)
            for _ in range(3):  # the calls' tasks, then the flush of their answers
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
    cells = [f"{b}/packet {asyncio.run(_measure(b, args.rounds)):.1f} us" for b in (1, 16, 64)]
    print(f"{args.root}: CPU per call: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
