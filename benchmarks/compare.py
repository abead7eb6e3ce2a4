"""raftkv vs etcd vs PySyncObj: three-node clusters on loopback, same load generator, one table.

    .venv/bin/python benchmarks/compare.py                       # table + JSON + PNG in benchmarks/results/
    .venv/bin/python benchmarks/compare.py --doc docs/performance.md   # ...and regenerate the doc
    .venv/bin/python benchmarks/compare.py --systems raftkv,etcd --put-clients 64 --duration 3

For each system in turn (``benchmarks/systems.py``: raftkv's ``LocalCluster``, three Debian
``etcd`` processes, three ``benchmarks/pysyncobj_kv.py`` processes): start it, wait for a
leader that acknowledges a write, warm up, then run ``raftkv bench`` workloads through
etcd's JSON gateway against the leader (``--target-leader``): ``put`` at each of
``--put-clients`` (default 1, 16, 64) and linearizable ``range`` at each of
``--range-clients`` (default 64), ``--duration`` seconds each, ``--val-size`` 256-byte
values over ``--key-space-size`` keys; then stop it. For raftkv it also scrapes every
member's ``/metrics`` around the put run at the largest client count: fsyncs per committed
entry (``raftkv_wal_fsync_duration_seconds_count`` over ``raftkv_raft_commit_index``) and
entries per append message (``raftkv_raft_append_entries_sent_total`` over
``raftkv_raft_append_messages_sent_total``). Each cell also records ``others_cores``: the
cores other work on the machine kept busy during it (``/proc/stat`` minus this run's
processes), printed with the cell, so a cell measured beside someone else's load shows it.

Prints one table (ops/s, p50, p99 per system; ratios raftkv/etcd and raftkv/pysyncobj) and
the targets met or missed (``targets``); writes ``compare.json`` (raw summaries),
``compare.png`` (throughput vs clients, matplotlib Agg) and ``compare.md`` (the table) into
``--out-dir``; with ``--doc`` also the whole ``docs/performance.md``.

``--protocol grpc`` measures raftkv and etcd (the systems that serve etcd's gRPC API) with
the same workloads sent as etcd's KV gRPC calls by the same load generator
(``raftkv bench --protocol grpc``), and writes ``compare-grpc.json``/``.png``/``.md``
instead (no targets: those are the JSON gateway's; no ``--doc``: the doc's gRPC section is
written by hand from ``compare-grpc.md``)::

    .venv/bin/python benchmarks/compare.py --protocol grpc    # raftkv vs etcd through gRPC

``--protocol grpc-lean`` sends those calls through the lean HTTP/2 client instead
(``kvserver.bench.h2_client``), which leaves the servers more of a small machine
(``compare-grpc-lean.*``).

Not a test: numbers depend on the machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.systems import SYSTEMS, process_cpu_s  # noqa: E402
from kvserver.bench.runner import run  # noqa: E402
from kvserver.bench.workloads import BenchOptions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


GRPC_SYSTEMS = ("raftkv", "etcd")  # the systems that serve etcd's gRPC API


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--protocol",
        choices=("http", "grpc", "grpc-lean"),
        default="http",
        help="http: etcd's JSON gateway (default); grpc: etcd's KV gRPC calls "
        "(raftkv and etcd only); grpc-lean: the same calls from the lean HTTP/2 client",
    )
    ap.add_argument(
        "--systems", default=None, help="default: raftkv,etcd,pysyncobj (http), raftkv,etcd (grpc)"
    )
    ap.add_argument("--put-clients", type=_ints, default=[1, 16, 64])
    ap.add_argument("--range-clients", type=_ints, default=[64])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of puts before measuring")
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    ap.add_argument("--val-size", type=int, default=256)
    ap.add_argument("--key-space-size", type=int, default=10000)
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--doc", default=None, help="also write this markdown document")
    ap.add_argument("--raftkv-args", default="", help="extra `raftkv serve` flags")
    args = ap.parse_args(argv)
    if args.systems is None:
        args.systems = ",".join(GRPC_SYSTEMS) if args.protocol != "http" else ",".join(SYSTEMS)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)} (known: {', '.join(SYSTEMS)})")
    if args.protocol != "http":
        no_grpc = set(args.systems.split(",")) - set(GRPC_SYSTEMS)
        if no_grpc:
            ap.error(
                f"--protocol {args.protocol}: {', '.join(sorted(no_grpc))} does not serve gRPC"
            )
        if args.doc:
            ap.error(f"--protocol {args.protocol}: no --doc (the doc's gRPC section is by hand)")
    return args


# --- measuring ---------------------------------------------------------------------------


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (``/proc/stat``: all but idle, iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def bench_with_cpu(system, leader: str, op: str, clients: int, args) -> dict:
    """``bench`` plus CPU accounting: CPU microseconds per completed request of every server
    process (the most loaded one is the leader) and of the load generator (this process and
    its load processes); and ``others_cores``, the cores that other work on the machine kept
    busy meanwhile (a cell measured beside someone else's work says so)."""
    pids = system.pids()
    servers0 = [process_cpu_s(p) for p in pids]
    own0 = _own_cpu_s()
    busy0, t0 = _machine_busy_s(), time.monotonic()
    r = bench(leader, op, clients, args)
    busy1, t1 = _machine_busy_s(), time.monotonic()
    servers1 = [process_cpu_s(p) for p in pids]
    own1 = _own_cpu_s()
    ours = sum(b - a for a, b in zip(servers0, servers1, strict=True)) + (own1 - own0)
    r["others_cores"] = max(0.0, (busy1 - busy0) - ours) / (t1 - t0)
    if r["count"]:
        per_process = [(b - a) * 1e6 / r["count"] for a, b in zip(servers0, servers1, strict=True)]
        r["cpu_us_per_op"] = {
            "servers": sum(per_process),
            "busiest_server": max(per_process),
            "load_generator": (own1 - own0) * 1e6 / r["count"],
        }
    return r


def bench(leader: str, op: str, clients: int, args, duration: float | None = None) -> dict:
    opts = BenchOptions(
        op=op,
        endpoints=[leader],
        clients=clients,
        duration_s=duration or args.duration,
        val_size=args.val_size,
        key_space_size=args.key_space_size,
        key_size=8,
        consistency="l",
        protocol=args.protocol,
        procs=min(args.procs, clients),
    ).validate()
    s = run(opts).summary()
    return {
        "ops_per_s": s.requests_per_s,
        "count": s.count,
        "errors": s.errors,
        "p50_ms": s.percentiles.get(50.0, 0) * 1e3,
        "p99_ms": s.percentiles.get(99.0, 0) * 1e3,
        "summary": s.to_json(),
    }


_METRIC_RE = re.compile(r"^(raftkv_[a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)
BATCHING_METRICS = (
    "raftkv_wal_fsync_duration_seconds_count",
    "raftkv_raft_commit_index",
    "raftkv_raft_append_messages_sent_total",
    "raftkv_raft_append_entries_sent_total",
    "raftkv_raft_is_leader",
)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in _METRIC_RE.finditer(text)
        if m.group(1) in BATCHING_METRICS
    }


def batching(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Per member: fsyncs per committed entry, entries per append message (deltas)."""
    out = {}
    for url in after:
        a, b = after[url], before[url]

        def d(name, a=a, b=b):
            return a.get(name, 0.0) - b.get(name, 0.0)

        committed = d("raftkv_raft_commit_index")
        msgs = d("raftkv_raft_append_messages_sent_total")
        out[url] = {
            "leader": bool(a.get("raftkv_raft_is_leader")),
            "committed_entries": committed,
            "fsyncs": d("raftkv_wal_fsync_duration_seconds_count"),
            "fsyncs_per_committed_entry": d("raftkv_wal_fsync_duration_seconds_count") / committed
            if committed
            else None,
            "append_messages": msgs,
            "entries_per_append_message": d("raftkv_raft_append_entries_sent_total") / msgs
            if msgs
            else None,
        }
    return out


def measure(name: str, args, root: str) -> dict:
    cls = SYSTEMS[name]
    system = cls(root, extra_args=args.raftkv_args.split()) if name == "raftkv" else cls(root)
    results: dict = {"put": {}, "range": {}}
    with system:
        leader = system.wait_ready()
        print(f"{name}: leader {leader}", file=sys.stderr, flush=True)
        if args.warmup > 0:
            bench(leader, "put", 16, args, args.warmup)
        top = max(args.put_clients) if args.put_clients else None
        for n in args.put_clients:
            before = {u: scrape(u) for u in system.urls} if name == "raftkv" and n == top else None
            r = results["put"][n] = bench_with_cpu(system, leader, "put", n, args)
            if before is not None:
                after = {u: scrape(u) for u in system.urls}
                results["raftkv_batching"] = {"clients": n, "members": batching(before, after)}
            _progress(name, "put", n, r)
        for n in args.range_clients:
            r = results["range"][n] = bench_with_cpu(system, leader, "range", n, args)
            _progress(name, "range", n, r)
    return results


def _progress(name: str, op: str, n: int, r: dict) -> None:
    print(
        f"  {name:9s} {op:5s} x{n:<3d} {r['ops_per_s']:8.0f} ops/s  p50 {r['p50_ms']:7.2f} ms"
        f"  p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}"
        + (f"  others {r['others_cores']:.2f} cores" if "others_cores" in r else ""),
        file=sys.stderr,
        flush=True,
    )


# --- reporting ---------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(results: dict, systems: list[str]) -> list[list[str]]:
    head = ["workload"]
    for s in systems:
        head += [f"{s} ops/s", f"{s} p50 ms", f"{s} p99 ms"]
    others = [s for s in ("etcd", "pysyncobj") if s in systems and "raftkv" in systems]
    for o in others:
        head += [f"raftkv/{o} ops/s", f"raftkv/{o} p50"]
    rows = [head]
    for op, label in (("put", "put"), ("range", "range (linearizable)")):
        clients = sorted({n for s in systems for n in results[s][op]})
        for n in clients:
            row = [f"{label}, {n} client{'s' if n > 1 else ''}"]
            for s in systems:
                r = results[s][op].get(n)
                row += (
                    [f"{r['ops_per_s']:.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}"]
                    if r
                    else ["-"] * 3
                )
            for o in others:
                a, b = results["raftkv"][op].get(n), results[o][op].get(n)
                row += [
                    _ratio(a and a["ops_per_s"], b and b["ops_per_s"]),
                    _ratio(a and a["p50_ms"], b and b["p50_ms"]),
                ]
            rows.append(row)
    return rows


def format_text(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def format_markdown(rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(rows[0]) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """The performance targets: (what, met?, the numbers)."""
    out = []

    def get(s, op, n, key):
        r = results.get(s, {}).get(op, {}).get(n)
        return r[key] if r else None

    def ratio_target(what, op, n, other, want):
        a, b = get("raftkv", op, n, "ops_per_s"), get(other, op, n, "ops_per_s")
        if a is None or b is None:
            return
        out.append((what, a >= want * b, f"{a:.0f} vs {b:.0f} ops/s = {a / b:.2f}x"))

    ratio_target("puts at 64 clients >= 1.5x etcd", "put", 64, "etcd", 1.5)
    ratio_target("puts at 64 clients >= 3x PySyncObj", "put", 64, "pysyncobj", 3.0)
    ratio_target("linearizable gets at 64 clients >= 1.5x etcd", "range", 64, "etcd", 1.5)
    a, b = get("raftkv", "put", 1, "p50_ms"), get("etcd", "put", 1, "p50_ms")
    if a is not None and b is not None:
        out.append(("p50 put latency at 1 client <= etcd's", a <= b, f"{a:.2f} vs {b:.2f} ms"))
    return out


def format_cpu(results: dict, systems: list[str]) -> list[str]:
    """One line per workload: CPU microseconds per request, servers and load generator."""
    lines = []
    for op in ("put", "range"):
        for n in sorted({n for s in systems for n in results[s][op]}):
            parts = []
            for s in systems:
                c = results[s][op].get(n, {}).get("cpu_us_per_op")
                if c:
                    parts.append(
                        f"{s} {c['servers']:.0f} (busiest {c['busiest_server']:.0f}, "
                        f"load generator {c['load_generator']:.0f})"
                    )
            if parts:
                lines.append(f"{op} x{n}: " + "; ".join(parts))
    return lines


def format_batching(results: dict) -> list[str]:
    b = results.get("raftkv", {}).get("raftkv_batching")
    if not b:
        return []
    lines = []
    for url, m in sorted(b["members"].items(), key=lambda kv: not kv[1]["leader"]):
        role = "leader  " if m["leader"] else "follower"
        fpe, epm = m["fsyncs_per_committed_entry"], m["entries_per_append_message"]
        lines.append(
            f"{role} {url}: {m['committed_entries']:.0f} entries committed, "
            f"{m['fsyncs']:.0f} fsyncs"
            + (f" = {fpe:.3f} fsyncs/entry" if fpe is not None else "")
            + (
                f"; {m['append_messages']:.0f} MsgApps, {epm:.1f} entries/MsgApp"
                if epm is not None
                else ""
            )
        )
    return lines


def plot(results: dict, systems: list[str], path: str, protocol: str = "http") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    colors = {"raftkv": "tab:blue", "etcd": "tab:green", "pysyncobj": "tab:purple"}
    ticks: set[int] = set()
    for s in systems:
        color = colors.get(s)
        pts = sorted((n, r["ops_per_s"]) for n, r in results[s]["put"].items())
        if pts:
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=f"{s} put"
            )
        rpts = sorted((n, r["ops_per_s"]) for n, r in results[s]["range"].items())
        if rpts:
            ax.plot(
                [p[0] for p in rpts],
                [p[1] for p in rpts],
                marker="s",
                linestyle="--",
                color=color,
                markerfacecolor="none",
                label=f"{s} linearizable range",
            )
        ticks.update(p[0] for p in pts + rpts)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("requests/s")
    how = "etcd JSON gateway" if protocol == "http" else "etcd gRPC API"
    ax.set_title(f"Three nodes on loopback, {how}, 256-byte values")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- the machine (for the doc) -----------------------------------------------------------


def machine() -> dict:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_gb, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    try:
        out = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10)
        info["etcd"] = out.stdout.splitlines()[0] if out.stdout else "?"
    except (OSError, subprocess.SubprocessError):
        info["etcd"] = "not installed"
    try:
        import pysyncobj

        info["pysyncobj"] = getattr(pysyncobj, "__version__", None) or _dist_version("pysyncobj")
    except ImportError:
        info["pysyncobj"] = "not installed"
    info.update(fsync_latency())
    return info


def _git_describe() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def fsync_latency(seconds: float = 2.0) -> dict:
    """wal_bench's raw loop (pwrite 288 bytes + fdatasync) in a temp dir on the data disk."""
    from benchmarks.wal_bench import RawSync, fs_of

    d = tempfile.mkdtemp(prefix="fsync-")
    try:
        raw = RawSync(d)
        n, elapsed = raw.run(seconds)
        raw.close()
        return {
            "fsync_dir_fs": fs_of(d),
            "fdatasync_per_s": n / elapsed,
            "fdatasync_ms": elapsed / n * 1e3,
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = args.systems.split(",")
    os.makedirs(args.out_dir, exist_ok=True)
    results: dict = {}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()[0]  # how busy the machine was (others' work skews cells)
    for name in systems:
        root = tempfile.mkdtemp(prefix=f"compare-{name}-")
        try:
            results[name] = measure(name, args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    rows = table(results, systems)
    print(f"\n{args.protocol}:\n" + format_text(rows))
    checks = targets(results) if args.protocol == "http" else []
    for what, ok, numbers in checks:
        print(f"{'MET ' if ok else 'MISS'}  {what}: {numbers}")
    batch_lines = format_batching(results)
    if batch_lines:
        top = results["raftkv"]["raftkv_batching"]["clients"]
        print(f"\nraftkv batching during the put run at {top} clients:")
        for line in batch_lines:
            print("  " + line)
    cpu_lines = format_cpu(results, systems)
    if cpu_lines:
        print("\nCPU microseconds per request, all three servers (busiest server; load generator):")
        for line in cpu_lines:
            print("  " + line)
    mach = machine() if args.doc else None
    if mach is not None:
        mach["raftkv_commit"] = _git_describe()
    doc = {
        "started": started,
        "load_average_before": load_before,
        "argv": sys.argv[1:],
        "options": vars(args),
        "results": results,
        "targets": [{"what": w, "met": ok, "numbers": n} for w, ok, n in checks],
        "machine": mach,
    }
    stem = "compare" if args.protocol == "http" else f"compare-{args.protocol}"
    json_path = os.path.join(args.out_dir, stem + ".json")
    png_path = os.path.join(args.out_dir, stem + ".png")
    md_path = os.path.join(args.out_dir, stem + ".md")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    plot(results, systems, png_path, args.protocol)
    with open(md_path, "w") as f:
        f.write(format_markdown(rows) + "\n")
    print(f"\nwrote {json_path}, {png_path}, {md_path}", file=sys.stderr)
    if args.doc:
        from benchmarks.perfdoc import kept_sections, render

        kept = kept_sections(args.doc)
        doc_dir = os.path.dirname(os.path.abspath(args.doc))
        stem = os.path.splitext(os.path.basename(args.doc))[0]
        shutil.copyfile(png_path, os.path.join(doc_dir, stem + ".png"))  # the doc's picture
        shutil.copyfile(json_path, os.path.join(doc_dir, stem + ".json"))  # and its raw data
        with open(args.doc, "w") as f:
            f.write(
                render(
                    doc,
                    format_markdown(rows),
                    checks,
                    batch_lines,
                    cpu_lines,
                    stem + ".png",
                    " ".join(["benchmarks/compare.py", *(argv or sys.argv[1:])]),
                )
                + ("\n" + kept if kept else "")
            )
        print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
