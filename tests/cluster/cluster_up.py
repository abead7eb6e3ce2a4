"""``raftkv cluster up`` as a real process, for the tests that supervise and kill it.

``ClusterUp`` starts ``python -m kvserver.cli cluster up`` on free ports (``--base-port 0``)
in a data directory, reads everything it prints on a thread, and parses the pid, URLs, log
and restart command of each member it announces. ``gone(pid)`` tells whether a process has
exited. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from tests.cluster.harness import get_json_safe
from tests.support.procs import stop_process
from tests.support.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


NODE_LINE = re.compile(r"^\s+(node\d+): pid (\d+)\s+client (\S+)\s+peer (\S+)\s+log (\S+)$")


STARTUP_S = 60.0


class ClusterUp:
    """A ``cluster up`` process and everything it printed (read by a thread, line by line)."""

    def __init__(self, data_dir: str, *extra: str):
        def default_sigint():  # the test run may have inherited SIGINT as ignored
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvserver.cli",
                "cluster",
                "up",
                "--nodes",
                "3",
                "--base-port",
                "0",
                "--data-dir",
                data_dir,
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            preexec_fn=default_sigint,
        )
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.nodes: dict[str, dict] = {}
        self._parse_startup()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(None)

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: re.Pattern, timeout_s: float, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        seen = start
        while True:
            for i in range(seen, len(self.lines)):
                m = pattern.search(self.lines[i])
                if m:
                    return m
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self._new.empty()):
                raise AssertionError(
                    f"no line matching {pattern.pattern!r}; output:\n{self.output()}"
                )
            try:
                self._new.get(timeout=min(left, 0.5))
            except queue.Empty:
                pass

    def _parse_startup(self) -> None:
        self.wait_line(re.compile(r"^Ctrl-C stops the cluster"), STARTUP_S)
        for i, line in enumerate(self.lines):
            m = NODE_LINE.match(line)
            if m:
                name, pid, client, peer, log = m.groups()
                self.nodes[name] = {
                    "pid": int(pid),
                    "url": client,
                    "peer": peer,
                    "log": log,
                    "command": self.lines[i + 1].strip(),
                }
        assert sorted(self.nodes) == ["node1", "node2", "node3"], self.output()

    def urls(self, names=None) -> list[str]:
        return [self.nodes[n]["url"] for n in (names or self.nodes)]

    def wait_healthy(self, names=None, timeout_s: float = STARTUP_S) -> None:
        for url in self.urls(names):
            wait_for(
                lambda u=url: get_json_safe(u, "/health") == 200,
                timeout_s,
                f"{url}/health 200\n{self.output()}",
            )

    def leader(self, names=None) -> str:
        """The name of the member every listed member names as leader."""
        by_id = {}

        def agreed():
            leaders = set()
            for name in names or self.nodes:
                try:
                    with urllib.request.urlopen(
                        self.nodes[name]["url"] + "/v1/status", timeout=2
                    ) as r:
                        st = json.loads(r.read())
                except OSError:
                    return None
                by_id[st["id"]] = name
                leaders.add(st["leader"])
            return len(leaders) == 1 and leaders.pop()

        lead = wait_for(agreed, STARTUP_S, "an agreed leader")
        return by_id[lead]

    def stop(self) -> int:
        """Ctrl-C; returns the exit status (SIGKILL after a bounded wait)."""
        if not stop_process(self.proc, 60, signal.SIGINT):
            raise AssertionError(f"cluster up ignored Ctrl-C for 60 s:\n{self.output()}")
        return self.proc.returncode


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (or is a zombie nobody reaped: not ours to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
