"""``raftkv serve`` (one member) and ``raftkv cluster up`` (a local cluster of processes)."""

import logging
import os
import signal
import sys
import time

from kvserver.cluster import LocalCluster
from kvserver.config import add_server_flags, config_from_args
from kvserver.membership import ClusterConfigError


def register(sub) -> None:
    p = sub.add_parser("serve", help="run one member (no flags: a one-node store in "
                                     "./raftkv-data on 127.0.0.1:2379)")
    add_server_flags(p)
    p.add_argument("--log-level", default=os.environ.get("RAFTKV_LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_serve)

    c = sub.add_parser("cluster", help="run a local cluster of real processes on loopback")
    csub = c.add_subparsers(dest="cluster_command", metavar="COMMAND")
    csub.required = True
    up = csub.add_parser("up", help="start N members, print endpoints; Ctrl-C stops them all")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data-dir", default="raftkv-data/cluster")
    up.add_argument("--base-port", type=int, default=2379,
                    help="client port of node1; others at +20000, +30000, ... like etcd's "
                         "Procfile; peers at client port + 1")
    up.set_defaults(func=cmd_cluster_up)


def cmd_serve(args) -> int:
    from kvserver.server import run  # imports aiohttp & co only when serving
    from kvserver.storage import StorageCorruptError

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
    except ClusterConfigError as exc:
        print(f"raftkv serve: {exc}", file=sys.stderr)
        return 2
    try:
        run(cfg)
    except StorageCorruptError as exc:
        print(f"raftkv serve: refusing to start: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"raftkv serve: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_cluster_up(args) -> int:
    if not 1 <= args.nodes <= 9:
        print("raftkv cluster up: --nodes must be between 1 and 9", file=sys.stderr)
        return 2
    cluster = LocalCluster(args.data_dir, size=args.nodes, base_port=args.base_port)
    cluster.start()
    print(f"raftkv: {args.nodes}-node cluster starting (data and logs in {args.data_dir})")
    for node in cluster.nodes:
        print(f"  {node.name}: client {node.client_url}  peer {node.peer_url}  "
              f"log {node.log_path}")
    endpoints = ",".join(cluster.endpoints)
    print(f"\nTry, in another terminal:\n  export RAFTKV_ENDPOINTS={endpoints}"
          "\n  .venv/bin/raftkv put greeting hello"
          "\n  .venv/bin/raftkv get greeting"
          "\n  .venv/bin/raftkv status"
          f"\n  curl -X PUT --data-binary hello {cluster.endpoints[0]}/v1/kv/greeting"
          f"\n  curl {cluster.endpoints[0]}/v1/kv/greeting"
          "\n\nCtrl-C stops the cluster.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while True:
            time.sleep(0.5)
            for node in cluster.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    print(f"raftkv: {node.name} exited with {node.proc.returncode}; last "
                          f"log lines:\n{cluster.log_tail(node)}", file=sys.stderr)
                    return 1
    except KeyboardInterrupt:
        print("\nraftkv: stopping the cluster", flush=True)
        return 0
    finally:
        cluster.stop()
