"""Does a compaction give memory back? RSS of one member before and after compacting away
most of its history, and after a restart (docs/operations.md, "Memory").

    .venv/bin/python -m benchmarks.rss_after_compaction [--puts 200000] [--keys 8]

Starts ``raftkv serve`` (one member, ``--wal-sync never``, a fresh data dir under /tmp) on
loopback ports, writes ``--puts`` 100-byte values over ``--keys`` keys through the client
(64 in flight), compacts at the last revision, restarts the member from its data dir, and
prints VmRSS (``/proc/PID/status``) and the db size at each step. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request

from kvserver.client import AsyncClient
from kvserver.localcluster.launcher import free_ports


def vm_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def db_size(url: str) -> int:
    req = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.load(resp).get("dbSize", 0))


def start(data_dir: str, url: str, peer: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "kvserver.cli", "serve", "--name", "rss"]
    args += ["--data-dir", data_dir, "--wal-sync", "never"]
    args += ["--listen-client-urls", url, "--advertise-client-urls", url]
    args += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def ready(client: AsyncClient) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await client.get("ready")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def report(step: str, pid: int, url: str) -> None:
    print(f"{step:<24} VmRSS {vm_rss_kb(pid) / 1024:8.1f} MiB   db size {db_size(url):>12,} B")


async def run(puts: int, keys: int) -> None:
    client_port, peer_port = free_ports(2)
    url, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    data_dir = tempfile.mkdtemp(prefix="raftkv-rss-")
    proc = start(data_dir, url, peer)
    try:
        async with AsyncClient([url], timeout_s=30) as client:
            await ready(client)
            report("started", proc.pid, url)
            sem = asyncio.Semaphore(64)
            value = "v" * 100

            async def one(i: int) -> None:
                async with sem:
                    await client.put(f"key{i % keys}", value)

            await asyncio.gather(*(one(i) for i in range(puts)))
            report(f"after {puts} puts", proc.pid, url)
            await client.compact((await client.status()).revision)
            report("after compaction", proc.pid, url)
    finally:
        proc.terminate()
        proc.wait()
    proc = start(data_dir, url, peer)
    try:
        async with AsyncClient([url], timeout_s=30) as client:
            await ready(client)
            report("after restart", proc.pid, url)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(run(args.puts, args.keys))


if __name__ == "__main__":
    main()
