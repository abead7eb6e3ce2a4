"""``raftkv bench put|range|txn-put|watch-latency|mixed``: a load generator, etcd-style.

Drives etcd's JSON gateway (``--dialect v3``, so the same tool measures etcd, raftkv and the
PySyncObj comparison server) or raftkv's ``/v1`` REST dialect, with ``--clients`` concurrent
requests over ``--conns`` persistent, pipelining HTTP/1.1 connections, from ``--procs``
processes whose measurements are merged exactly. ``--protocol grpc`` sends the same
workloads (not ``watch-latency``) as etcd's KV gRPC calls instead, ``--clients`` concurrent
calls over ``--conns`` channels, to raftkv or etcd alike; ``--protocol grpc-lean`` sends
those calls through a lean HTTP/2 client of ours (``kvserver.bench.h2_client``) that costs
far less CPU than grpc.aio, so a small machine's cores go to the server. Prints etcd's report (summary, response time
histogram, latency distribution 10%..99.9%, error distribution) or ``--json``; a progress
bar on stderr when it is a terminal. See ``kvserver.bench`` for the parts.

Exit status: 0 when every request succeeded; 1 when some failed or the run could not be done
(``Error: ...`` on stderr); 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from kvserver.bench.workloads import BenchOptions, BenchUsageError
from kvserver.cli.auth import add_user_options, auth_header

_HELP = {
    "put": "put keys (etcd benchmark put)",
    "range": "read keys (linearizable unless --consistency s)",
    "txn-put": "transactions of --txn-ops puts (v3 only)",
    "watch-latency": "put→event latency seen by --watchers watchers of one key (v3 only)",
    "mixed": "puts and reads (--read-ratio of reads)",
}


def _positive_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def register(sub) -> None:
    p = sub.add_parser("bench", help="load generator: latency percentiles and throughput")
    bsub = p.add_subparsers(dest="bench_command", metavar="WORKLOAD")
    bsub.required = True
    for op, help_text in _HELP.items():
        b = bsub.add_parser(op, help=help_text, description=help_text)
        _add_common(b)
        if op == "txn-put":
            b.add_argument(
                "--txn-ops", type=_positive_int, default=1, help="puts per transaction (default 1)"
            )
        if op == "mixed":
            b.add_argument(
                "--read-ratio",
                type=_number,
                default=0.5,
                help="fraction of requests that are reads (default 0.5)",
            )
        if op == "watch-latency":
            b.add_argument(
                "--watchers",
                type=_positive_int,
                default=10,
                help="watch streams on the key (default 10)",
            )
        b.set_defaults(func=_run, bench_op=op)


def _add_common(b: argparse.ArgumentParser) -> None:
    default_endpoints = os.environ.get("RAFTKV_ENDPOINTS", "http://127.0.0.1:2379")
    b.add_argument(
        "--endpoints",
        default=default_endpoints,
        help="comma-separated client URLs (default $RAFTKV_ENDPOINTS or http://127.0.0.1:2379)",
    )
    b.add_argument(
        "--clients", type=_positive_int, default=1, help="concurrent requests in flight (default 1)"
    )
    b.add_argument(
        "--conns",
        type=_positive_int,
        default=None,
        help="TCP connections, shared by the clients (HTTP/1.1 pipelining; gRPC: one "
        "channel each, calls multiplexed) (default: one per client)",
    )
    g = b.add_mutually_exclusive_group()
    g.add_argument(
        "--total", type=_positive_int, default=None, help="requests in all (default 10000)"
    )
    g.add_argument(
        "--duration",
        type=_number,
        default=None,
        metavar="SECONDS",
        help="run for this long instead of --total",
    )
    b.add_argument(
        "--rate",
        type=_number,
        default=0.0,
        help="requests/s over all clients (default 0: unlimited; "
        "watch-latency: puts/s, default 100)",
    )
    b.add_argument("--key-size", type=_positive_int, default=8, help="key bytes (default 8)")
    b.add_argument("--val-size", type=_positive_int, default=8, help="value bytes (default 8)")
    b.add_argument(
        "--key-space-size", type=_positive_int, default=1, help="distinct keys (default 1)"
    )
    b.add_argument(
        "--sequential-keys", action="store_true", help="keys in order instead of uniformly random"
    )
    b.add_argument(
        "--consistency",
        choices=("l", "s"),
        default="l",
        help="reads: l linearizable (default), s serializable",
    )
    b.add_argument(
        "--target-leader",
        action="store_true",
        help="send every request to the leader (found via /v3/maintenance/status)",
    )
    b.add_argument(
        "--dialect",
        choices=("v3", "rest"),
        default="v3",
        help="v3: etcd's JSON gateway (default); rest: raftkv's /v1/kv",
    )
    b.add_argument(
        "--protocol",
        choices=("http", "grpc", "grpc-lean"),
        default="http",
        help="http: the --dialect's HTTP requests (default); grpc: etcd's KV gRPC calls "
        "through the generated stubs, on the same client URLs; grpc-lean: the same calls "
        "framed by a lean HTTP/2 client that costs the load generator less CPU",
    )
    b.add_argument(
        "--procs",
        type=_positive_int,
        default=1,
        help="load-generator processes (default 1); results are merged exactly",
    )
    b.add_argument(
        "--timeout",
        type=_number,
        default=10.0,
        metavar="SECONDS",
        help="one request's deadline (default 10)",
    )
    b.add_argument(
        "--seed", type=_positive_int, default=None, help="random key choice seed (default: random)"
    )
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    for flag, env, what in (
        ("--cacert", "RAFTKV_CACERT", "CA bundle that verifies https endpoints"),
        ("--cert", "RAFTKV_CERT", "client certificate for https endpoints"),
        ("--key", "RAFTKV_KEY", "the client certificate's private key"),
    ):
        b.add_argument(
            flag,
            dest=f"tls_{flag[2:]}",
            default=os.environ.get(env),
            metavar="FILE",
            help=f"{what} (default ${env})",
        )
    add_user_options(b)  # --user NAME[:PASSWORD], --password: one token for the whole run


def options_from_args(args) -> BenchOptions:
    return BenchOptions(
        op=args.bench_op,
        endpoints=[e.strip() for e in args.endpoints.split(",") if e.strip()],
        clients=args.clients,
        conns=args.conns,
        total=args.total,
        duration_s=args.duration,
        rate=args.rate,
        key_size=args.key_size,
        val_size=args.val_size,
        key_space_size=args.key_space_size,
        sequential_keys=args.sequential_keys,
        consistency=args.consistency,
        target_leader=args.target_leader,
        dialect=args.dialect,
        protocol=args.protocol,
        procs=args.procs,
        txn_ops=getattr(args, "txn_ops", 1),
        read_ratio=getattr(args, "read_ratio", 0.5),
        watchers=getattr(args, "watchers", 10),
        timeout_s=args.timeout,
        seed=args.seed,
        cacert=args.tls_cacert,
        cert=args.tls_cert,
        key=args.tls_key,
    ).validate()


def _with_token(args, opts: BenchOptions) -> BenchOptions:
    """``opts`` with the token of ``--user`` (authenticated once at the first endpoint)."""
    headers = auth_header(
        opts.endpoints[0],
        args,
        timeout_s=args.timeout,
        tls={"ca_file": opts.cacert, "cert_file": opts.cert, "key_file": opts.key},
    )
    return replace(opts, token=headers.get("Authorization"))


def _run(args) -> int:
    # The runner (multiprocessing, the load loops) loads only when a bench runs, so every
    # other raftkv command starts without it.
    from kvserver.bench.report import ProgressBar, format_report
    from kvserver.bench.result import BenchError
    from kvserver.bench.runner import new_progress, run

    try:
        opts = options_from_args(args)
    except BenchUsageError as exc:
        print(f"raftkv bench {args.bench_op}: error: {exc}", file=sys.stderr)
        return 2
    try:
        opts = _with_token(args, opts)
    except Exception as exc:  # a wrong password, an unreachable endpoint: before the run
        print(f"Error: --user: {exc}", file=sys.stderr)
        return 1
    progress = new_progress(opts.procs)
    try:
        with ProgressBar(progress, opts.total, opts.duration_s):
            result = run(opts, progress)
    except BenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        sys.stdout.write(format_report(result))
    return 1 if result.stats.error_count else 0
