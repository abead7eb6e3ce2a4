"""What an attack did to the cluster it hit: the leader's term and memory, and honest calls.

``HonestClient`` is the bystander: through etcd's gRPC API it sends a Put and a Range every
``interval_s`` with a ``deadline_s`` deadline, and counts calls that failed or ran past it.
``process_rss`` is a process's resident memory with its children's (a raftkv member's front
ends are its children; etcd has none). ``tests/abuse`` and ``benchmarks/abuse.py`` use both
around each attack of ``kvserver.bench.h2_attacks``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import grpc

from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return found


def process_rss(pid: int, *, children: bool = True) -> int:
    """Resident bytes of ``pid`` (and of its children, and theirs)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
        if children:
            todo.extend(_children(current))
    return total


@dataclass
class HonestReport:
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0


class HonestClient(threading.Thread):
    """Put then Range, every ``interval_s``, each with a ``deadline_s`` deadline."""

    def __init__(self, target: str, *, interval_s: float = 0.5, deadline_s: float = 3.0):
        super().__init__(daemon=True)
        self.target = target
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self.report = HonestReport()
        self.stopping = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            n = 0
            while not self.stopping.is_set():
                n += 1
                key = b"abuse/honest/%d" % (n % 16)
                self._timed("put", kv.Put, rpc_pb2.PutRequest(key=key, value=b"v"))
                self._timed("range", kv.Range, rpc_pb2.RangeRequest(key=key))
                self.stopping.wait(self.interval_s)

    def _timed(self, name: str, method, request) -> None:
        started = time.monotonic()
        try:
            method(request, timeout=self.deadline_s)
        except grpc.RpcError as exc:
            self.report.failures.append(f"{name}: {exc.code().name} {exc.details()}")
        self.report.calls += 1
        self.report.slowest_s = max(self.report.slowest_s, time.monotonic() - started)

    def stop(self) -> HonestReport:
        self.stopping.set()
        self.join(self.deadline_s * 3)
        return self.report
