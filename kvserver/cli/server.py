"""``raftkv serve`` (one member) and ``raftkv cluster up`` (a local cluster of processes)."""

import logging
import os
import signal
import sys

from kvserver.localcluster.launcher import LocalCluster
from kvserver.localcluster.ports import taken_ports
from kvserver.localcluster.supervisor import RESTART_POLICIES, Supervisor
from kvserver.membership.identity import ClusterConfigError
from kvserver.server.config import add_server_flags, config_from_args
from kvserver.tls import TLSConfigError


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="run one member (no flags: a one-node store in ./raftkv-data on 127.0.0.1:2379)",
    )
    add_server_flags(p)
    p.add_argument(
        "--log-level",
        default=os.environ.get("RAFTKV_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    p.set_defaults(func=cmd_serve)

    c = sub.add_parser("cluster", help="run a local cluster of real processes on loopback")
    csub = c.add_subparsers(dest="cluster_command", metavar="COMMAND")
    csub.required = True
    up = csub.add_parser(
        "up",
        help="start N members and supervise them (a dead member is "
        "restarted, the others keep serving); Ctrl-C stops them all",
    )
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument(
        "--data-dir",
        default="raftkv-data/cluster",
        help="each member's data in DATA_DIR/nodeN, its log in DATA_DIR/nodeN.log",
    )
    up.add_argument(
        "--base-port",
        type=int,
        default=2379,
        help="client port of node1; others at +20000, +30000, ... like etcd's "
        "Procfile; peers at client port + 1. 0: free ports chosen by the "
        "kernel",
    )
    up.add_argument(
        "--restart",
        choices=RESTART_POLICIES,
        default="on-failure",
        help="on-failure (default): restart a member that dies (at most 5 times "
        "in 60 s, 1 s delay doubling up to 30 s); no: leave it down and "
        "print the command that starts it again",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="https for clients and peers with a throwaway CA made in "
        "DATA_DIR/tls (peers must present a certificate it signed; clients "
        "need only trust it: --cacert DATA_DIR/tls/ca.pem)",
    )
    up.set_defaults(func=cmd_cluster_up)


def cmd_serve(args) -> int:
    from kvserver.assembly.member import run  # imports aiohttp & co only when serving
    from kvserver.server.node_storage import StorageCorruptError

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
    except TLSConfigError as exc:  # a certificate or key that does not load
        print(f"raftkv serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _raftkv_program() -> list[str]:
    """How members are started: the ``raftkv`` script installed beside this interpreter (the
    command a user would type), else this interpreter with ``-m kvserver.cli``."""
    script = os.path.join(os.path.dirname(sys.executable), "raftkv")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "kvserver.cli"]


def cmd_cluster_up(args) -> int:
    if not 1 <= args.nodes <= 9:
        print("raftkv cluster up: --nodes must be between 1 and 9", file=sys.stderr)
        return 2
    top = args.base_port + (10000 * args.nodes if args.nodes > 1 else 0) + 1  # last peer port
    if args.base_port != 0 and not (1 <= args.base_port and top <= 65535):
        print(
            f"raftkv cluster up: --base-port {args.base_port} puts ports outside 1..65535 "
            "(0 picks free ports)",
            file=sys.stderr,
        )
        return 2
    # Absolute paths, so the printed commands work from any directory.
    data_dir = os.path.abspath(args.data_dir)
    try:
        cluster = LocalCluster(
            data_dir,
            size=args.nodes,
            base_port=args.base_port or None,
            program=_raftkv_program(),
            tls=args.tls,
            # Killed outright (SIGKILL, OOM killer), this process takes its members with it
            # rather than leaving them holding the ports. The supervisor starts and restarts
            # them from this (the main) thread, which the parent-death signal requires.
            die_with_parent=True,
        )
    except TLSConfigError as exc:  # no `cryptography` to make the CA
        print(f"raftkv cluster up: {exc}", file=sys.stderr)
        return 2
    conflicts = taken_ports(cluster.nodes)
    if conflicts:
        for conflict in conflicts:
            print(f"raftkv cluster up: {conflict.message()}", file=sys.stderr)
        print(
            "raftkv cluster up: nothing was started; stop what holds the port, or choose "
            "other ports with --base-port (0: free ports chosen by the kernel)",
            file=sys.stderr,
        )
        return 1
    supervisor = Supervisor(cluster, restart=args.restart)
    # SIGTERM ends the cluster as Ctrl-C does (the members run in their own sessions, so a
    # Ctrl-C in this terminal reaches only this process, which stops them in order).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        supervisor.start()
    except BaseException:
        cluster.stop()
        raise
    print(f"raftkv: {args.nodes}-node cluster starting (data and logs in {data_dir})")
    for node in cluster.nodes:
        assert node.proc is not None  # started above
        print(
            f"  {node.name}: pid {node.proc.pid}  client {node.client_url}  "
            f"peer {node.peer_url}  log {node.log_path}\n    {node.command_line()}"
        )
    if args.restart == "on-failure":
        policy = (
            "a member that dies is restarted (at most 5 times per 60 s, with a growing "
            "delay); `--restart no` leaves it down and prints its command"
        )
    else:
        policy = "a member that dies is left down (--restart no); its command is printed"
    endpoints = ",".join(cluster.endpoints)
    tls_env = curl_tls = ""
    if cluster.pki is not None:
        ca = cluster.pki.ca_file
        print(
            f"\nTLS: the cluster's CA is {ca} (its key is not kept: a throwaway CA); "
            f"a client certificate signed by it: {cluster.pki.client_cert} "
            f"(key {cluster.pki.client_key})"
        )
        tls_env = f"\n  export RAFTKV_CACERT={ca}"
        curl_tls = f"--cacert {ca} "
    print(
        f"\nSupervising: {policy}; the others keep serving."
        f"\n\nTry, in another terminal:\n  export RAFTKV_ENDPOINTS={endpoints}{tls_env}"
        "\n  .venv/bin/raftkv put greeting hello"
        "\n  .venv/bin/raftkv get greeting"
        "\n  .venv/bin/raftkv status"
        f"\n  curl {curl_tls}-X PUT --data-binary hello {cluster.endpoints[0]}/v1/kv/greeting"
        f"\n  curl {curl_tls}{cluster.endpoints[0]}/v1/kv/greeting"
        "\n\nCtrl-C stops the cluster.",
        flush=True,
    )
    return supervisor.run()
