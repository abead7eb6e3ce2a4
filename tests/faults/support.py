"""Real member processes under disk and clock faults: a cluster, a write load, the checks.

- ``FaultCluster``: a ``LocalCluster`` whose members each may run under a shim (their own
  environment or wrapper command: ``tests.faults.shims``) and whose data directories may
  live on a size-limited tmpfs the test mounts (``mount_tmpfs``; unmounted in ``stop``).
- ``Load``: writer threads putting unique keys through the etcd gateway, each to one
  member (failing over to the next on an error), recording every acknowledged put and each
  put's latency. ``rate(since, until)`` and ``p99(since, until)`` read the record.
- The checks every fault test makes: ``check_acked`` (no acknowledged put lost: each is
  read back, linearizably, with its value), ``check_files_open`` (every snapshot file of a
  stopped member opens and its WAL verifies), ``metric`` (a member's /metrics sample).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import snap
from kvserver.localcluster.launcher import LocalCluster, NodeProcess
from tests.cluster.harness import get_prefix, leader_of, status, wait_healthy
from tests.support.wait import wait_for

FAST_TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


class FaultCluster(LocalCluster):
    """A LocalCluster with per-member environments/wrappers and optional tmpfs data dirs."""

    mounts: list[str]

    def __post_init__(self):
        super().__post_init__()
        self.mounts = []

    def mount_tmpfs(self, node: NodeProcess, size: str) -> None:
        """Put ``node``'s data dir on a tmpfs of ``size`` (``32m``); root only."""
        os.makedirs(node.data_dir, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", node.data_dir], check=True
        )
        self.mounts.append(node.data_dir)

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        for path in self.mounts:
            subprocess.run(["umount", "-l", path], check=False)
        self.mounts.clear()

    def by_id(self) -> dict[int, NodeProcess]:
        out = {}
        for n in self.nodes:
            st = status(n) if n.alive() else None
            if st is not None:
                out[st["id"]] = n
        return out

    def leader(self, timeout_s: float = 30.0, among=None) -> NodeProcess:
        return wait_for(lambda: leader_of(self, among), timeout_s, "an agreed leader")


def can_mount() -> bool:
    return os.geteuid() == 0


@dataclass
class Load:
    """Writer threads putting ``prefix/<thread>/<n>`` = ``v<n>`` (module doc)."""

    endpoints: list[str]
    threads: int = 8
    prefix: str = "load"
    timeout_s: float = 5.0
    acked: dict[str, str] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (end, latency) of acks
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for t in range(self.threads):
            w = threading.Thread(target=self._run, args=(t,), daemon=True, name=f"load-{t}")
            w.start()
            self._workers.append(w)
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self._workers:
            w.join(timeout=self.timeout_s + 5)

    def _run(self, t: int) -> None:
        member = t % len(self.endpoints)
        conn: http.client.HTTPConnection | None = None
        n = 0
        while not self._stop.is_set():
            if conn is None:
                parts = urlsplit(self.endpoints[member])
                conn = http.client.HTTPConnection(
                    parts.hostname, parts.port, timeout=self.timeout_s
                )
            key, value = f"{self.prefix}/{t}/{n}", f"v{n}"
            body = json.dumps(
                {
                    "key": base64.b64encode(key.encode()).decode(),
                    "value": base64.b64encode(value.encode()).decode(),
                }
            )
            started = time.monotonic()
            try:
                conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = None
            ended = time.monotonic()
            n += 1
            if ok:
                with self._lock:
                    self.acked[key] = value
                    self.samples.append((ended, ended - started))
            else:
                with self._lock:
                    self.errors += 1
                member = (member + 1) % len(self.endpoints)
                if conn is not None:
                    conn.close()
                    conn = None
                self._stop.wait(0.05)

    def rate(self, since: float, until: float) -> float:
        with self._lock:
            n = sum(1 for end, _ in self.samples if since <= end < until)
        return n / max(1e-9, until - since)

    def p99(self, since: float, until: float) -> float:
        with self._lock:
            lat = sorted(lat for end, lat in self.samples if since <= end < until)
        return lat[max(0, int(0.99 * len(lat)) - 1)] if lat else float("nan")

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)


def check_acked(cluster: LocalCluster, acked: dict[str, str], prefix: str = "load/") -> None:
    """Every acknowledged put is there with its value (a linearizable range through a
    healthy member)."""
    member = wait_healthy(cluster, among=[n for n in cluster.nodes if n.alive()])
    stored = get_prefix(member.client_url, prefix)
    lost = [k for k, v in acked.items() if stored.get(k) != v]
    assert not lost, f"{len(lost)} acknowledged puts lost, e.g. {lost[:5]}"


def check_files_open(node: NodeProcess) -> None:
    """A stopped member's files: every ``.snap`` file reads back, and its WAL verifies
    (``raftkv wal verify``, a torn tail excepted: the member repairs one itself)."""
    snap_dir = os.path.join(node.data_dir, "member", "snap")
    if os.path.isdir(snap_dir):
        for name in sorted(os.listdir(snap_dir)):
            if name.endswith(".snap"):
                snap.read_snap(os.path.join(snap_dir, name))
    wal_dir = os.path.join(node.data_dir, "member", "wal")
    if os.path.isdir(wal_dir):
        out = subprocess.run(
            [sys.executable, "-m", "kvserver.cli", "wal", "verify", wal_dir],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 or "torn" in (out.stdout + out.stderr), (
            f"{node.name}'s WAL does not verify:\n{out.stdout}{out.stderr}"
        )


def metric(node: NodeProcess, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` on ``node``'s /metrics (None: absent)."""
    parts = urlsplit(node.client_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def health(node: NodeProcess) -> tuple[int, str]:
    parts = urlsplit(node.client_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=3)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)
    finally:
        conn.close()
