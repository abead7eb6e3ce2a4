"""Three-node raftkv against three-node etcd, same load generator, same machine, one run.

Starts each cluster on loopback in turn (raftkv via ``kvserver.cluster.LocalCluster``, etcd
from Debian's ``etcd-server`` package), finds its leader, and drives the etcd v3 JSON gateway
(``POST /v3/kv/put`` and linearizable ``POST /v3/kv/range``) with 256-byte values from
``--procs`` load-generator processes holding persistent connections. Prints one table: ops/s,
p50 and p99 latency per system and workload, and the raftkv/etcd ratios.

    .venv/bin/python benchmarks/cluster_bench.py                  # 1/16/64 clients, 5 s each
    .venv/bin/python benchmarks/cluster_bench.py --clients 64 --duration 10 --json

Not a test: numbers depend on the machine and on whatever else runs on it.
"""

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvserver.cluster import LocalCluster, free_ports  # noqa: E402

VALUE = base64.b64encode(b"v" * 256).decode()


# --- load generator (runs in child processes) ------------------------------------------------

async def _drive(url: str, op: str, clients: int, duration_s: float, worker: int) -> list[float]:
    import aiohttp

    path = "/v3/kv/put" if op == "put" else "/v3/kv/range"
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # warm the connections so connection setup is not measured
        await asyncio.gather(*(session.post(url + "/v3/kv/range",
                                            json={"key": VALUE[:8]}) for _ in range(clients)))
        deadline = time.perf_counter() + duration_s

        async def client(c: int) -> None:
            i = 0
            while True:
                key = base64.b64encode(f"bench-{worker}-{c}-{i % 1000}".encode()).decode()
                body = {"key": key, "value": VALUE} if op == "put" else {"key": key}
                started = time.perf_counter()
                if started >= deadline:
                    return
                async with session.post(url + path, json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{op} answered {resp.status}")
                latencies.append(time.perf_counter() - started)
                i += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return latencies


def _worker(args) -> list[float]:
    url, op, clients, duration_s, worker = args
    return asyncio.run(_drive(url, op, clients, duration_s, worker))


def run_load(url: str, op: str, clients: int, duration_s: float, procs: int) -> dict:
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    with mp.get_context("spawn").Pool(procs) as pool:
        parts = pool.map(_worker, [(url, op, n, duration_s, i) for i, n in enumerate(shares)])
    lat = sorted(x for part in parts for x in part)
    if not lat:
        return {"ops_per_s": 0.0, "p50_ms": None, "p99_ms": None, "count": 0}
    return {"ops_per_s": len(lat) / duration_s, "count": len(lat),
            "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3}


# --- clusters ---------------------------------------------------------------------------------

def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=2) as resp:
        return json.loads(resp.read())


def find_leader(urls: list[str], timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for url in urls:
            try:
                st = _post(url, "/v3/maintenance/status", {})
                if st.get("leader") and st["leader"] == st["header"]["member_id"]:
                    _post(url, "/v3/kv/put", {"key": VALUE[:8], "value": VALUE})
                    return url
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"no leader among {urls}")


class EtcdCluster:
    def __init__(self, root: str, size: int = 3):
        self.binary = shutil.which("etcd")
        if not self.binary:
            raise RuntimeError("etcd not found (apt-get install etcd-server)")
        ports = free_ports(2 * size)
        self.urls = [f"http://127.0.0.1:{ports[2 * i]}" for i in range(size)]
        peers = [f"http://127.0.0.1:{ports[2 * i + 1]}" for i in range(size)]
        initial = ",".join(f"e{i}={p}" for i, p in enumerate(peers))
        self.cmds = [[self.binary, "--name", f"e{i}", "--data-dir", os.path.join(root, f"e{i}"),
                      "--listen-client-urls", self.urls[i], "--advertise-client-urls",
                      self.urls[i], "--listen-peer-urls", peers[i],
                      "--initial-advertise-peer-urls", peers[i], "--initial-cluster", initial,
                      "--initial-cluster-state", "new", "--initial-cluster-token", "bench",
                      "--log-level", "error"] for i in range(size)]
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        self.procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       env=env) for c in self.cmds]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


class RaftkvCluster:
    def __init__(self, root: str, size: int = 3):
        self.cluster = LocalCluster(os.path.join(root, "raftkv"), size=size)
        self.urls = self.cluster.endpoints

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()


SYSTEMS = {"raftkv": RaftkvCluster, "etcd": EtcdCluster}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--ops", default="put,get")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    ops = args.ops.split(",")
    results: dict = {}
    for name in args.systems.split(","):
        root = tempfile.mkdtemp(prefix=f"bench-{name}-")
        system = SYSTEMS[name](root)
        system.start()
        try:
            leader = find_leader(system.urls)
            for op in ops:
                for n in clients:
                    r = run_load(leader, op, n, args.duration, args.procs)
                    results[(name, op, n)] = r
                    print(f"{name:7s} {op:4s} clients={n:3d} {r['ops_per_s']:8.0f} ops/s  "
                          f"p50 {r['p50_ms'] or 0:7.2f} ms  p99 {r['p99_ms'] or 0:7.2f} ms",
                          file=sys.stderr, flush=True)
        finally:
            system.stop()
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps([{"system": s, "op": o, "clients": c, **r}
                          for (s, o, c), r in results.items()], indent=2))
        return 0
    names = args.systems.split(",")
    print(f"\n{'workload':14s}" + "".join(f"{n + ' ops/s':>14s}{'p50 ms':>9s}{'p99 ms':>9s}"
                                          for n in names)
          + ("  raftkv/etcd ops  p50" if {"raftkv", "etcd"} <= set(names) else ""))
    for op in ops:
        for n in clients:
            row = f"{op + ' x' + str(n):14s}"
            for name in names:
                r = results[(name, op, n)]
                row += f"{r['ops_per_s']:14.0f}{r['p50_ms'] or 0:9.2f}{r['p99_ms'] or 0:9.2f}"
            if {"raftkv", "etcd"} <= set(names):
                a, b = results[("raftkv", op, n)], results[("etcd", op, n)]
                row += f"  {a['ops_per_s'] / max(b['ops_per_s'], 1e-9):9.2f}x " \
                       f"{(a['p50_ms'] or 0) / max(b['p50_ms'] or 1e-9, 1e-9):5.2f}x"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
