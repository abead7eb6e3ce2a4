"""The three systems compare.py measures, each a three-node cluster on loopback.

Each system has ``name``, ``urls`` (client URLs, etcd gateway dialect), ``start()``,
``wait_ready()`` (bounded poll until a leader answers a write) and ``stop()`` (SIGTERM, then
SIGKILL after a bound; no leftovers), and works as a context manager.

- ``RaftkvSystem``: ``kvserver.localcluster.launcher.LocalCluster`` (three ``raftkv serve`` processes).
- ``EtcdSystem``: three ``etcd`` processes (Debian's ``etcd-server``; etcd 3.4 here).
- ``PySyncObjSystem``: three ``benchmarks/pysyncobj_kv.py`` processes.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import cast

from kvserver.bench.result import BenchError, find_leader, post_json, serving
from kvserver.localcluster.launcher import LocalCluster, free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
READY_TIMEOUT_S = 60.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frontend_pids(member_pid: int) -> list[int]:
    """A raftkv member's gRPC front-end processes (its children that run the front end)."""
    found = []
    try:
        with open(f"/proc/{member_pid}/task/{member_pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        return []
    for pid in children:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"kvserver.api.grpc.frontend" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


class _Processes:
    """Child processes with logs; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []

    def spawn(self, args: list[str], name: str) -> None:
        log_path = os.path.join(self.root, f"{name}.log")
        with open(log_path, "wb") as log:
            self.procs.append(
                subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        self.logs.append(log_path)

    def check_alive(self) -> None:
        for p, log in zip(self.procs, self.logs, strict=True):
            if p.poll() is not None:
                program = cast(list, p.args)[0]
                raise BenchError(f"{program} exited with {p.returncode}; see {log}")

    def respawn(self, index: int) -> subprocess.Popen:
        """Start process ``index`` again with the same arguments and log (unless it runs)."""
        old = self.procs[index]
        if old.poll() is None:
            return old
        with open(self.logs[index], "ab") as log:
            self.procs[index] = subprocess.Popen(
                old.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self.procs[index]

    def stop(self, timeout_s: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


class System:
    name = "?"
    urls: list[str]
    procs: _Processes  # (the systems that spawn their own processes)

    def __init__(self, root: str) -> None:
        self.root = os.path.join(root, self.name)
        os.makedirs(self.root, exist_ok=True)

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def check_alive(self) -> None:
        pass

    def pids(self) -> list[int]:
        """The server processes (for CPU accounting)."""
        return [p.pid for p in self.procs.procs]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The leader's URL, once it has acknowledged a write."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                leader = find_leader(self.urls, timeout_s=1.0)
                post_json(
                    leader,
                    "/v3/kv/put",
                    {"key": base64.b64encode(b"ready").decode(), "value": ""},
                    timeout_s=5.0,
                )
                return leader
            except (BenchError, OSError, ValueError) as exc:
                last = str(exc)
                time.sleep(0.2)
        raise BenchError(f"{self.name} not ready after {timeout_s:g} s: {last}")

    # --- one member (benchmarks/scale.py: restart and catch-up) ---------------------------

    def data_dirs(self) -> list[str]:
        """Each member's data directory, in the order of ``urls``."""
        raise NotImplementedError

    def member_proc(self, index: int) -> subprocess.Popen | None:
        """The process of member ``index`` (the order of ``urls``), None if never started."""
        raise NotImplementedError

    def start_member(self, index: int) -> None:
        """Start member ``index`` again (same data directory, ports and flags) unless it runs."""
        raise NotImplementedError

    def stop_member(self, index: int, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> None:
        """Send ``sig`` to member ``index`` and wait until it has exited; SIGKILL it if it
        outlives ``timeout_s``."""
        p = self.member_proc(index)
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout_s)

    def __enter__(self) -> System:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class RaftkvSystem(System):
    name = "raftkv"

    def __init__(self, root: str, extra_args: list[str] | None = None, size: int = 3) -> None:
        super().__init__(root)
        self.cluster = LocalCluster(
            os.path.join(self.root, "data"), size=size, extra_args=list(extra_args or [])
        )
        self.urls = self.cluster.endpoints

    def start(self) -> None:
        self.cluster.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The leader's URL, once it has acknowledged a write and every member's front ends
        serve: a connection a member accepts before that is sent away once they do, and a
        benchmark should not measure that move."""
        deadline = time.monotonic() + timeout_s
        leader = super().wait_ready(timeout_s)
        waiting = list(self.urls)
        while waiting:
            self.check_alive()
            if serving(waiting[0], timeout_s=2.0):
                waiting.pop(0)
                continue
            if time.monotonic() > deadline:
                raise BenchError(f"raftkv: front ends of {waiting[0]} not ready")
            time.sleep(0.1)
        return leader

    def check_alive(self) -> None:
        for n in self.cluster.nodes:
            if not n.alive():
                raise BenchError(
                    f"raftkv {n.name} exited; log tail:\n{self.cluster.log_tail(n, 20)}"
                )

    def stop(self) -> None:
        self.cluster.stop()

    def pids(self) -> list[int]:
        """The members' processes, each followed by its gRPC front ends (if it has any)."""
        pids = []
        for n in self.cluster.nodes:
            if n.proc is not None:
                pids.append(n.proc.pid)
                pids.extend(frontend_pids(n.proc.pid))
        return pids

    def data_dirs(self) -> list[str]:
        return [n.data_dir for n in self.cluster.nodes]

    def member_proc(self, index: int) -> subprocess.Popen | None:
        return self.cluster.nodes[index].proc

    def start_member(self, index: int) -> None:
        self.cluster.start_node(self.cluster.nodes[index])


class EtcdSystem(System):
    name = "etcd"

    def __init__(
        self,
        root: str,
        scheme: str = "http",
        extra_args: list[str] | None = None,
        size: int = 3,
    ) -> None:
        """``scheme`` "https" with TLS flags in ``extra_args``: https client and peer URLs."""
        super().__init__(root)
        binary = shutil.which("etcd")
        if not binary:
            raise BenchError("etcd is not installed (Debian package etcd-server)")
        self.binary = binary
        ports = free_ports(2 * size)
        self.urls = [f"{scheme}://127.0.0.1:{ports[2 * i]}" for i in range(size)]
        self.peers = [f"{scheme}://127.0.0.1:{ports[2 * i + 1]}" for i in range(size)]
        self.extra_args = list(extra_args or [])
        self.procs = _Processes(self.root)

    def start(self) -> None:
        initial = ",".join(f"e{i}={p}" for i, p in enumerate(self.peers))
        for i in range(len(self.urls)):
            self.procs.spawn(
                [
                    self.binary,
                    "--name",
                    f"e{i}",
                    "--data-dir",
                    os.path.join(self.root, f"e{i}"),
                    "--listen-client-urls",
                    self.urls[i],
                    "--advertise-client-urls",
                    self.urls[i],
                    "--listen-peer-urls",
                    self.peers[i],
                    "--initial-advertise-peer-urls",
                    self.peers[i],
                    "--initial-cluster",
                    initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    "bench",
                    "--log-level",
                    "warn",
                    *self.extra_args,
                ],
                f"e{i}",
            )

    def check_alive(self) -> None:
        self.procs.check_alive()

    def stop(self) -> None:
        self.procs.stop()

    def data_dirs(self) -> list[str]:
        return [os.path.join(self.root, f"e{i}") for i in range(len(self.urls))]

    def member_proc(self, index: int) -> subprocess.Popen | None:
        return self.procs.procs[index] if index < len(self.procs.procs) else None

    def start_member(self, index: int) -> None:
        self.procs.respawn(index)


class PySyncObjSystem(System):
    name = "pysyncobj"

    def __init__(self, root: str, batch: bool = False) -> None:
        super().__init__(root)
        ports = free_ports(6)
        self.urls = [f"http://127.0.0.1:{ports[2 * i]}" for i in range(3)]
        self.raft = [f"127.0.0.1:{ports[2 * i + 1]}" for i in range(3)]
        self.batch = batch
        self.procs = _Processes(self.root)

    def start(self) -> None:
        for i in range(3):
            args = [
                sys.executable,
                os.path.join(HERE, "pysyncobj_kv.py"),
                "--raft",
                self.raft[i],
                "--partners",
                ",".join(a for j, a in enumerate(self.raft) if j != i),
                "--http",
                self.urls[i].removeprefix("http://"),
                "--journal",
                os.path.join(self.root, f"n{i}.journal"),
            ]
            self.procs.spawn(args + (["--batch"] if self.batch else []), f"n{i}")

    def check_alive(self) -> None:
        self.procs.check_alive()

    def stop(self) -> None:
        self.procs.stop()


SYSTEMS = {"raftkv": RaftkvSystem, "etcd": EtcdSystem, "pysyncobj": PySyncObjSystem}
