"""A local cluster of real ``raftkv serve`` processes on loopback.

Used by ``raftkv cluster up`` and by the multi-process tests. Each node is a child process
with its own data directory ``<data_dir>/<name>`` and its own log file
``<data_dir>/<name>.log``; ``kill`` sends any signal (SIGKILL, SIGSTOP, SIGCONT), ``restart``
starts a stopped node again on the same ports and data. ``joining_node(name)`` prepares (does
not start) one more node that joins the running cluster with ``--initial-cluster-state
existing`` (add it first with ``raftkv member add``).

``die_with_parent=True`` (what ``raftkv cluster up`` uses): on Linux every node is started with
a parent-death signal (SIGTERM), so a launcher that is killed outright, even by SIGKILL, takes
its nodes with it instead of leaving them running and holding their ports. The kernel sends
that signal when the *thread* that started the node exits, so such a cluster must start and
restart its nodes from a thread that lives as long as the launcher (the main thread). The
default (False) leaves nodes independent of their starter, as the multi-process tests want.
"""

import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvserver.localcluster.bytecode import compile_member_packages
from kvserver.tls import ClusterPKI, make_cluster_pki

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago (bound and released by the kernel)."""
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def parent_death_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the calling thread exits,
    or None where the platform has no such thing (not Linux, or no ``prctl`` in libc).

    The hook runs in the child between fork and exec: it only calls ``prctl`` and, if the
    parent already died before that call (the child was reparented, so no signal would ever
    come), exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    signum = int(sig)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


@dataclass
class NodeProcess:
    name: str
    client_port: int
    peer_port: int
    data_dir: str
    log_path: str
    args: list[str]
    proc: subprocess.Popen | None = None
    scheme: str = "http"  # "https": client and peer URLs use TLS

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command_line(self) -> str:
        """The node's command, quoted for a POSIX shell."""
        return shlex.join(self.args)


@dataclass
class LocalCluster:
    data_dir: str
    size: int = 3
    base_port: int | None = None  # None: free ports chosen by the kernel
    extra_args: list[str] = field(default_factory=list)
    token: str = "raftkv-local"
    nodes: list[NodeProcess] = field(default_factory=list)
    program: list[str] = field(default_factory=lambda: [sys.executable, "-m", "kvserver.cli"])
    # TLS: "https" URLs (extra_args must then carry the cert flags), or tls=True: a throwaway
    # CA in <data_dir>/tls (kvserver.tls.make_cluster_pki), https client and peer URLs,
    # peers authenticated by certificate (--peer-client-cert-auth), clients not required to
    # present one. ``pki`` holds the file names.
    scheme: str = "http"
    tls: bool = False
    pki: ClusterPKI | None = None
    die_with_parent: bool = False
    # Per node name: environment added to its process (LD_PRELOAD of a fault shim, ...) and
    # a command its serve command runs under (``fiu-run -x``, ...): fault tests.
    node_env: dict[str, dict[str, str]] = field(default_factory=dict)
    node_wrapper: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self):
        if self.tls:
            self.scheme = "https"
            self.pki = make_cluster_pki(os.path.join(self.data_dir, "tls"), ["127.0.0.1"])
            p = self.pki
            self.extra_args = [
                "--cert-file",
                p.server_cert,
                "--key-file",
                p.server_key,
                "--trusted-ca-file",
                p.ca_file,
                "--peer-cert-file",
                p.server_cert,
                "--peer-key-file",
                p.server_key,
                "--peer-trusted-ca-file",
                p.ca_file,
                "--peer-client-cert-auth",
                *self.extra_args,
            ]
        if self.base_port is None:
            ports = free_ports(2 * self.size)
            pairs = [(ports[2 * i], ports[2 * i + 1]) for i in range(self.size)]
        else:  # etcd's Procfile: 2379/2380, 22379/22380, 32379/32380, ...
            offsets = [10000 * (i + 1) if i else 0 for i in range(self.size)]
            pairs = [(self.base_port + o, self.base_port + o + 1) for o in offsets]
        names = [f"node{i + 1}" for i in range(self.size)]
        initial = ",".join(
            f"{n}={self.scheme}://127.0.0.1:{p}" for n, (_, p) in zip(names, pairs, strict=True)
        )
        os.makedirs(self.data_dir, exist_ok=True)
        for name, (cport, pport) in zip(names, pairs, strict=True):
            node = NodeProcess(
                name,
                cport,
                pport,
                os.path.join(self.data_dir, name),
                os.path.join(self.data_dir, f"{name}.log"),
                [],
                scheme=self.scheme,
            )
            node.args = self._serve_args(node, initial, "new")
            self.nodes.append(node)

    def joining_node(self, name: str) -> NodeProcess:
        """A new node on free ports whose ``--initial-cluster`` is every current node plus
        itself; appended to ``nodes`` (``start_node`` starts it)."""
        cport, pport = free_ports(2)
        node = NodeProcess(
            name,
            cport,
            pport,
            os.path.join(self.data_dir, name),
            os.path.join(self.data_dir, f"{name}.log"),
            [],
            scheme=self.scheme,
        )
        initial = ",".join(f"{n.name}={n.peer_url}" for n in [*self.nodes, node])
        node.args = self._serve_args(node, initial, "existing")
        self.nodes.append(node)
        return node

    def _serve_args(self, node: NodeProcess, initial_cluster: str, state: str) -> list[str]:
        return [
            *self.program,
            "serve",
            "--name",
            node.name,
            "--data-dir",
            node.data_dir,
            "--listen-client-urls",
            node.client_url,
            "--advertise-client-urls",
            node.client_url,
            "--listen-peer-urls",
            node.peer_url,
            "--initial-advertise-peer-urls",
            node.peer_url,
            "--initial-cluster",
            initial_cluster,
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            self.token,
            *self.extra_args,
        ]

    @property
    def endpoints(self) -> list[str]:
        return [n.client_url for n in self.nodes]

    def start(self) -> None:
        for node in self.nodes:
            self.start_node(node)

    def start_node(self, node: NodeProcess) -> subprocess.Popen:
        """Start ``node`` unless it is running; returns its process either way."""
        if node.proc is not None and node.proc.poll() is None:
            return node.proc
        log = open(node.log_path, "ab")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
        log.write(
            f"===== {stamp}: starting {node.name}; the same member by hand:\n"
            f"{node.command_line()}\n".encode()
        )
        log.flush()
        compile_member_packages()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.node_env.get(node.name, {}))
        # Each node in its own session: a Ctrl-C in the launcher's terminal reaches only the
        # launcher, which stops the nodes in order.
        node.proc = subprocess.Popen(
            [*self.node_wrapper.get(node.name, []), *node.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=parent_death_hook() if self.die_with_parent else None,
        )
        log.close()
        return node.proc

    def kill(self, node: NodeProcess, sig: int = signal.SIGKILL) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                node.proc.wait(timeout=30)

    def restart(self, node: NodeProcess) -> None:
        self.kill(node, signal.SIGKILL)
        self.start_node(node)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every node (resuming stopped ones first), SIGKILL what outlives timeout."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()

    def log_tail(self, node: NodeProcess, lines: int = 30) -> str:
        try:
            with open(node.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""
