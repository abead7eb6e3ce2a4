"""etcd's snapshot files at scale: raftkv beside etcd 3.4, restoring and saving.

    .venv/bin/python -m benchmarks.etcd_snapshot_bench [--keys 1000000] [--dir DIR] [--json OUT]

1. **The file.** An etcd snapshot of ``--keys`` keys with 256-byte values and some history,
   written in etcd's schema by ``kvserver.etcdsnap``'s bolt writer (loading a million keys
   through etcd's API takes longer than everything measured here): every key put once, a
   fifth of them put again, half of those before the compaction and half after it (so the
   file holds versions below and above the compact revision), a thousand leases with a key
   each, two users. ``etcdctl snapshot status`` must read it (bbolt's ``Tx.Check`` passes).
2. **Restore, then start.** ``raftkv snapshot restore`` + ``raftkv serve`` until a read of
   the last key answers; beside it ``etcdctl snapshot restore`` + ``etcd`` until the same
   read answers. Wall time of each step and its peak RSS (``wait4``'s ``ru_maxrss`` for the
   restore commands; the server's ``VmHWM`` once it answered).
3. **Save.** ``etcdctl snapshot save`` against each of the two servers just started: wall
   time, the server's RSS before and its peak during (``VmHWM``: it counts the file pages
   the server maps, the spilled image and the bolt file for raftkv, etcd's own database),
   its anonymous memory (heap) before and at its peak (``RssAnon``, sampled every 50 ms),
   and for raftkv the peak RSS of the conversion child. The two files are checked with
   ``etcdctl snapshot status`` (same revision and key count).

One machine, one run: numbers to compare the two programs by, not a benchmark of either.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import bcrypt

from bolt import BoltWriter
from kvserver.etcdpb import auth_pb2, kv_pb2, lease_pb2
from kvserver.etcdsnap import schema as S
from kvserver.localcluster.launcher import free_ports

RAFTKV = [sys.executable, "-m", "kvserver.cli"]
ENV = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
VALUE_BYTES = 256
LEASES = 1000


def synthesize(path: str, keys: int) -> dict:
    """Write the etcd snapshot described in the module docstring; its numbers."""
    rewrites = keys // 5
    compact = keys + 1 + rewrites // 2  # first revision 2: keys fill 2..keys+1
    value = b"0123456789abcdef" * (VALUE_BYTES // 16)

    def key(i: int) -> bytes:
        return b"bench/%08d" % i

    def lease_of(i: int) -> int:
        return 0x1000 + i // (keys // LEASES) if i % (keys // LEASES) == 0 else 0

    def pairs():
        # versions below the compaction survive only as each key's newest at or below it
        for i in range(keys):
            rev = 2 + i
            if i < rewrites // 2:
                continue  # rewritten before the compaction: this version was compacted
            kv = kv_pb2.KeyValue(
                key=key(i),
                create_revision=rev,
                mod_revision=rev,
                version=1,
                value=value,
                lease=lease_of(i),
            )
            yield S.revision_key(rev, 0), kv.SerializeToString()
        for j in range(rewrites):
            rev = keys + 2 + j
            kv = kv_pb2.KeyValue(
                key=key(j),
                create_revision=2 + j,
                mod_revision=rev,
                version=2,
                value=value[::-1],
                lease=lease_of(j),
            )
            yield S.revision_key(rev, 0), kv.SerializeToString()

    hashed = bcrypt.hashpw(b"rootpw", bcrypt.gensalt(10))
    with open(path + ".db", "w+b") as f:
        w = BoltWriter(f)
        refs = {S.KEY: w.write_bucket(pairs())}
        rev = S.revision_key(compact, 0)
        refs[S.META] = w.write_bucket(
            [
                (S.CONSISTENT_INDEX, S.pack_u64(keys + rewrites)),
                (S.FINISHED_COMPACT, rev),
                (S.SCHEDULED_COMPACT, rev),
            ]
        )
        refs[S.LEASE] = w.write_bucket(
            (S.lease_key(0x1000 + n), lease_pb2.Lease(ID=0x1000 + n, TTL=3600).SerializeToString())
            for n in range(LEASES)
        )
        refs[S.AUTH] = w.write_bucket([(S.AUTH_ENABLED, b"\x00"), (S.AUTH_REVISION, S.pack_u64(3))])
        refs[S.AUTH_USERS] = w.write_bucket(
            (name, auth_pb2.User(name=name, password=hashed, roles=roles).SerializeToString())
            for name, roles in ((b"alice", ["r1"]), (b"root", ["root"]))
        )
        refs[S.AUTH_ROLES] = w.write_bucket(
            [
                (
                    b"r1",
                    auth_pb2.Role(
                        name=b"r1",
                        keyPermission=[
                            auth_pb2.Permission(permType=2, key=b"bench/", range_end=b"bench0")
                        ],
                    ).SerializeToString(),
                )
            ]
        )
        for name in (S.ALARM, S.MEMBERS, S.MEMBERS_REMOVED):
            refs[name] = w.write_bucket([])
        refs[S.CLUSTER] = w.write_bucket([(S.CLUSTER_VERSION, b"3.4.0")])
        w.finish(sorted(refs.items()))
        f.seek(0)
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    os.rename(path + ".db", path)
    with open(path, "ab") as f:
        f.write(digest.digest())
    return {
        "keys": keys,
        "versions": keys + rewrites - rewrites // 2,
        "revision": keys + 1 + rewrites,
        "compact_revision": compact,
        "file_bytes": os.path.getsize(path),
    }


def timed(argv: list[str], env: dict | None = None) -> dict:
    """Run ``argv`` to its end: wall seconds and peak RSS (MiB), from wait4."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {err.decode()[-2000:]}")
    return {
        "seconds": round(wall, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "out": out.decode(),
    }


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                found += kids
                todo += kids
        except OSError:
            continue
    return found


def ctl(
    endpoint: str, *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["etcdctl", f"--endpoints={endpoint}", "--command-timeout=600s", *args],
        capture_output=True,
        text=True,
        env=ENV,
        check=check,
        timeout=timeout,
    )


def start_and_wait(
    argv: list[str], endpoint: str, probe_key: str, log: str, servers: list
) -> tuple[subprocess.Popen, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    servers.append(proc)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited; see {log}")
        r = ctl(endpoint, "get", probe_key, "--print-value-only", check=False, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return proc, time.perf_counter() - t0
        time.sleep(0.2)


def save(endpoint: str, server: subprocess.Popen, path: str) -> dict:
    before = status_kib(server.pid)
    child_peak = 0
    anon_peak = before["RssAnon"]
    done = threading.Event()

    def sample() -> None:
        nonlocal child_peak, anon_peak
        while not done.is_set():
            anon_peak = max(anon_peak, status_kib(server.pid)["RssAnon"])
            total = 0
            for kid in descendants(server.pid):
                try:
                    total += status_kib(kid).get("VmRSS", 0)
                except OSError:
                    pass
            child_peak = max(child_peak, total)
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    ctl(endpoint, "snapshot", "save", path)
    wall = time.perf_counter() - t0
    done.set()
    t.join()
    after = status_kib(server.pid)
    status = json.loads(ctl("", "snapshot", "status", path, "-w", "json").stdout)
    return {
        "seconds": round(wall, 2),
        "server_rss_before_mib": round(before["VmRSS"] / 1024),
        "server_peak_rss_mib": round(after["VmHWM"] / 1024),
        "server_anon_before_mib": round(before["RssAnon"] / 1024),
        "server_anon_peak_mib": round(anon_peak / 1024),
        "children_peak_rss_mib": round(child_peak / 1024),
        "file_bytes": os.path.getsize(path),
        "revision": status["revision"],
        "total_keys": status["totalKey"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="etcd-snapshot-bench-")
    os.makedirs(root, exist_ok=True)
    result: dict = {"keys": args.keys}
    path = os.path.join(root, "etcd.db")
    t0 = time.perf_counter()
    result["file"] = synthesize(path, args.keys)
    result["file"]["synthesize_s"] = round(time.perf_counter() - t0, 1)
    st = json.loads(ctl("", "snapshot", "status", path, "-w", "json").stdout)
    assert st["revision"] == result["file"]["revision"], st
    probe = f"bench/{args.keys - 1:08d}"
    servers = []
    try:
        # raftkv: restore, then serve
        rk_client, rk_peer = free_ports(2)
        peer = f"http://127.0.0.1:{rk_peer}"
        flags = [
            "--name",
            "r1",
            "--initial-cluster",
            f"r1={peer}",
            "--initial-cluster-token",
            "bench",
            "--initial-advertise-peer-urls",
            peer,
        ]
        rk_dir = os.path.join(root, "raftkv")
        restore = timed([*RAFTKV, "snapshot", "restore", path, "--data-dir", rk_dir, *flags])
        restore.pop("out")
        rk_url = f"http://127.0.0.1:{rk_client}"
        rk, started = start_and_wait(
            [
                *RAFTKV,
                "serve",
                "--data-dir",
                rk_dir,
                *flags,
                "--listen-peer-urls",
                peer,
                "--listen-client-urls",
                rk_url,
                "--advertise-client-urls",
                rk_url,
            ],
            rk_url,
            probe,
            os.path.join(root, "raftkv.log"),
            servers,
        )
        rss = status_kib(rk.pid)
        result["raftkv_restore"] = {
            **restore,
            "start_s": round(started, 2),
            "rss_after_start_mib": round(rss["VmRSS"] / 1024),
            "peak_rss_at_start_mib": round(rss["VmHWM"] / 1024),
        }

        # etcd: restore, then start
        e_client, e_peer = free_ports(2)
        epeer = f"http://127.0.0.1:{e_peer}"
        eflags = [
            "--name",
            "e1",
            "--initial-cluster",
            f"e1={epeer}",
            "--initial-cluster-token",
            "bench",
            "--initial-advertise-peer-urls",
            epeer,
        ]
        e_dir = os.path.join(root, "etcd")
        restore = timed(
            ["etcdctl", "snapshot", "restore", path, "--data-dir", e_dir, *eflags], env=ENV
        )
        restore.pop("out")
        e_url = f"http://127.0.0.1:{e_client}"
        etcd, started = start_and_wait(
            [
                "etcd",
                "--data-dir",
                e_dir,
                *eflags,
                "--listen-peer-urls",
                epeer,
                "--listen-client-urls",
                e_url,
                "--advertise-client-urls",
                e_url,
            ],
            e_url,
            probe,
            os.path.join(root, "etcd.log"),
            servers,
        )
        rss = status_kib(etcd.pid)
        result["etcd_restore"] = {
            **restore,
            "start_s": round(started, 2),
            "rss_after_start_mib": round(rss["VmRSS"] / 1024),
            "peak_rss_at_start_mib": round(rss["VmHWM"] / 1024),
        }

        result["raftkv_save"] = save(rk_url, rk, os.path.join(root, "from-raftkv.db"))
        result["etcd_save"] = save(e_url, etcd, os.path.join(root, "from-etcd.db"))
    finally:
        for s in servers:
            s.terminate()
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    main()
