"""The cost of TLS and auth, raftkv and etcd side by side in one run (docs/performance.md).

    .venv/bin/python -m benchmarks.security_cost --rounds 3 --duration 5

Starts four three-member clusters of real processes on free ports: raftkv plain, raftkv TLS,
etcd plain, etcd TLS. TLS means https client and peer URLs with peers checked by certificate
(``--peer-client-cert-auth``); both systems use the same throwaway CA and member certificate
(``kvserver.tls.make_cluster_pki``, what ``raftkv cluster up --tls`` makes; clients only
trust the CA). On every cluster the same auth setup goes through the v3 gateway
(``/v3/auth/...``): ``root`` with the root role, and a non-root user ``bench`` whose role
may READWRITE only the prefix the benchmark's keys use (so every request pays the token
lookup and the permission check). That gives four settings per system: plain, TLS, auth
(auth enabled, ``raftkv bench --user bench:...``), TLS+auth; auth is enabled and disabled
between measurements on the same cluster (as ``kvserver.bench.auth_compare`` does), so one
cluster serves "off" and "on" with the same data.

Each measurement is ``raftkv bench put --target-leader`` (kvserver/bench, the same client
for both systems: its client-side cost is equal on both sides): throughput at 64 clients and
p50 latency at 1 client. Rounds alternate over settings and, within a setting, over systems,
so both see the same background load. Prints a Markdown table (system x setting, medians
over rounds, the per-round numbers) and writes the whole result as JSON (``--out``). Every
bench run must have zero errors, else the script fails: a cost measured on refusals would
be meaningless. Every cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.systems import EtcdSystem
from kvserver.bench.auth_compare import BENCH_PW, PUT, ROOT_PW
from kvserver.bench.process import bench_process
from kvserver.bench.result import BenchError, find_leader, post_json
from kvserver.localcluster.launcher import LocalCluster

SETTINGS = ("plain", "TLS", "auth", "TLS+auth")
SYSTEMS = ("raftkv", "etcd")
# The prefix auth_compare's keys ("00000000".."00009999", its PUT) live under.
PREFIX, PREFIX_END = "0000", "0001"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


AUTH_SETUP: list[tuple[str, dict[str, Any]]] = [
    ("/v3/auth/user/add", {"name": "root", "password": ROOT_PW}),
    ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
    ("/v3/auth/role/add", {"name": "bench"}),
    (
        "/v3/auth/role/grant",
        {
            "name": "bench",
            "perm": {"permType": "READWRITE", "key": _b64(PREFIX), "range_end": _b64(PREFIX_END)},
        },
    ),
    ("/v3/auth/user/add", {"name": "bench", "password": BENCH_PW}),
    ("/v3/auth/user/grant", {"user": "bench", "role": "bench"}),
]


class Target:
    """One cluster as the benchmark sees it: endpoints, the CA (TLS) or None, stop()."""

    def __init__(
        self, system: str, tls: bool, endpoints: list[str], ca_file: str | None, stop
    ) -> None:  # noqa: ANN001
        self.system, self.tls, self.endpoints, self.ca_file = system, tls, endpoints, ca_file
        self.stop = stop
        self.ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.auth_on = False

    def post(self, path: str, body: dict, token: str | None = None) -> dict:
        leader = find_leader(self.endpoints, timeout_s=30, ssl_for=lambda url: self.ctx)
        if token is None:
            return post_json(leader, path, body, timeout_s=15, context=self.ctx)
        import urllib.request

        req = urllib.request.Request(
            leader + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": token},
        )
        with urllib.request.urlopen(req, timeout=15, context=self.ctx) as resp:
            return json.loads(resp.read())

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.post("/v3/kv/put", {"key": _b64("bench/ready"), "value": _b64("1")})
                return
            except (BenchError, OSError, ValueError) as exc:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{self.system} (tls={self.tls}) not ready: {exc}") from None
                time.sleep(0.2)

    def setup_auth(self) -> None:
        for path, body in AUTH_SETUP:
            self.post(path, body)

    def set_auth(self, enabled: bool) -> None:
        if enabled == self.auth_on:
            return
        if enabled:
            self.post("/v3/auth/enable", {})
        else:
            token = self.post("/v3/auth/authenticate", {"name": "root", "password": ROOT_PW})[
                "token"
            ]
            self.post("/v3/auth/disable", {}, token)
        self.auth_on = enabled
        # Proof that the setting holds: without a token a write is refused iff auth is on.
        try:
            self.post("/v3/kv/put", {"key": _b64(PREFIX + "check"), "value": ""})
            refused = False
        except OSError as exc:  # urllib's HTTPError (400 "user name is empty")
            refused = getattr(exc, "code", None) in (400, 401, 403)
            if not refused:
                raise
        if refused != enabled:
            raise SystemExit(f"{self.system}: auth is not {'on' if enabled else 'off'}")


def start_targets(root: str, targets: dict[tuple[str, bool], Target]) -> None:
    """Start the four clusters into ``targets`` (each entered as soon as it is started, so
    the caller stops it even when a later start or the setup fails)."""
    plain = LocalCluster(os.path.join(root, "raftkv-plain"), size=3)
    # tls=True makes the throwaway CA in <data_dir>/tls; etcd gets the very same files.
    tls = LocalCluster(os.path.join(root, "raftkv-tls"), size=3, tls=True)
    pki = tls.pki
    # No client-side --trusted-ca-file for etcd: etcd 3.4 then requires a client certificate
    # of every client (its transport sets RequireAndVerifyClientCert whenever a client CA is
    # given, --client-cert-auth or not), and a client certificate with CN "root" would also
    # make every token-less request root's. raftkv's --trusted-ca-file (cluster up --tls)
    # only verifies the leader a follower forwards to. So both: clients verify the server,
    # present nothing; peers verify each other.
    etcd_tls_args = [
        "--cert-file",
        pki.server_cert,
        "--key-file",
        pki.server_key,
        "--peer-cert-file",
        pki.server_cert,
        "--peer-key-file",
        pki.server_key,
        "--peer-trusted-ca-file",
        pki.ca_file,
        "--peer-client-cert-auth",
    ]
    etcd_plain = EtcdSystem(os.path.join(root, "etcd-plain"))
    etcd_tls = EtcdSystem(os.path.join(root, "etcd-tls"), scheme="https", extra_args=etcd_tls_args)
    for system, is_tls, obj, ca in (
        ("raftkv", False, plain, None),
        ("raftkv", True, tls, pki.ca_file),
        ("etcd", False, etcd_plain, None),
        ("etcd", True, etcd_tls, pki.ca_file),
    ):
        obj.start()
        endpoints = obj.endpoints if isinstance(obj, LocalCluster) else obj.urls
        targets[(system, is_tls)] = Target(system, is_tls, endpoints, ca, obj.stop)
    for t in targets.values():
        t.wait_ready()
        t.setup_auth()


def bench(target: Target, clients: int, duration_s: float, user: str | None) -> dict:
    """One ``raftkv bench`` run (a subprocess, as an operator runs it)."""
    out = bench_process(
        target.endpoints,
        PUT,
        clients,
        duration_s,
        ca_file=target.ca_file,
        user=user,
        what=f"bench against {target.system}",
    )
    if out.get("errors"):
        raise SystemExit(
            f"bench against {target.system} (tls={target.tls}, user={user}) "
            f"had {out['errors']} errors: {json.dumps(out)[:1000]}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.security_cost", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--data-dir", default=None, help="default: a temporary directory")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "security_cost.json"))
    args = p.parse_args(argv)
    root = args.data_dir or tempfile.mkdtemp(prefix="raftkv-security-cost-")
    results = {s: {k: {"tput64": [], "p50_1_ms": []} for k in SETTINGS} for s in SYSTEMS}
    targets: dict[tuple[str, bool], Target] = {}
    started = time.time()
    try:
        start_targets(root, targets)
        for r in range(args.rounds):
            for setting in SETTINGS:
                is_tls, auth = "TLS" in setting, "auth" in setting
                # Alternate which system goes first, so neither always follows the other.
                order = SYSTEMS if (r + SETTINGS.index(setting)) % 2 == 0 else SYSTEMS[::-1]
                for system in order:
                    t = targets[(system, is_tls)]
                    t.set_auth(auth)
                    user = f"bench:{BENCH_PW}" if auth else None
                    many = bench(t, 64, args.duration, user)
                    one = bench(t, 1, args.duration, user)
                    res = results[system][setting]
                    res["tput64"].append(many["requests_per_s"])
                    res["p50_1_ms"].append(one["percentiles_s"]["50"] * 1000)
                    print(
                        f"round {r + 1} {system:6} {setting:8}: "
                        f"{many['requests_per_s']:.0f} puts/s at 64 clients, "
                        f"p50 {one['percentiles_s']['50'] * 1000:.2f} ms at 1 client",
                        file=sys.stderr,
                    )
    finally:
        for t in targets.values():
            t.stop()
    table = [
        "| system | setting | puts/s, 64 clients | p50 ms, 1 client | rounds (puts/s / ms) |",
        "|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        for setting in SETTINGS:
            res = results[system][setting]
            rounds = ", ".join(
                f"{t:.0f}/{q:.2f}" for t, q in zip(res["tput64"], res["p50_1_ms"], strict=True)
            )
            table.append(
                f"| {system} | {setting} | {statistics.median(res['tput64']):.0f} | "
                f"{statistics.median(res['p50_1_ms']):.2f} | {rounds} |"
            )
    print("\n".join(table))
    doc = {
        "command": "python -m benchmarks.security_cost "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "rounds": args.rounds,
        "duration_s": args.duration,
        "workload": " ".join(PUT),
        "etcd": _etcd_version(),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "results": results,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _etcd_version() -> str:
    try:
        out = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0] if out.stdout else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
