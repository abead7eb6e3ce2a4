"""The supervising loop of ``raftkv cluster up``: keep a LocalCluster's members running.

Contract:
- A member that exits is reported on the console at once: its name, pid, how it ended (exit
  status or signal), the last lines of its log, and what happens next. The other members are
  never touched: they keep serving (a majority still elects a leader and takes writes).
- ``restart="on-failure"`` (the default of ``cluster up``): a member that died of a signal or
  exited with a non-zero status is started again with the same command, data and ports,
  after a backoff (1 s, 2 s, 4 s, ... at most 30 s; a member that stayed up for the whole
  window starts again from 1 s). At most ``max_restarts`` restarts per member in any
  ``window_s`` seconds; beyond that the supervisor gives up on it and prints the exact
  command to start it by hand. A member that exited with status 0 stopped on purpose (e.g.
  SIGTERM, or it was removed from the cluster) and is not restarted.
- ``restart="no"``: nothing is restarted; the exact command to start the member again is
  printed (also written at the top of each start in its log).
- When no member is running and none is waiting for a restart, the loop ends (status 1).
- Ctrl-C (KeyboardInterrupt) or SIGTERM stops every member (SIGTERM, then SIGKILL after a
  grace period) and ends the loop with status 0.
- Killed outright (SIGKILL), the supervisor runs no code at all; a cluster made with
  ``die_with_parent=True`` (as ``cluster up`` makes it) stops anyway, since each member gets
  SIGTERM from the kernel when the thread that started it exits. ``start`` and ``run`` (which
  restarts members) must then be called from the same thread, one that lives as long as the
  supervisor.

The restart budget (``RestartBudget``) is a pure object so its arithmetic is tested without
processes; ``Supervisor.run`` polls the children every ``poll_s`` (bounded, no busy wait).
"""

import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO

from kvserver.localcluster.launcher import LocalCluster, NodeProcess

RESTART_POLICIES = ("on-failure", "no")


@dataclass
class RestartBudget:
    """How many restarts a member may still have, and after which delay.

    ``next_delay(now)`` is None when the member already had ``max_restarts`` restarts within
    the last ``window_s`` seconds; otherwise the backoff before the next one, doubling with
    each restart still inside the window."""

    max_restarts: int = 5
    window_s: float = 60.0
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    _times: deque = field(default_factory=deque)

    def _forget_old(self, now: float) -> None:
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()

    def next_delay(self, now: float) -> float | None:
        self._forget_old(now)
        if len(self._times) >= self.max_restarts:
            return None
        return min(self.max_backoff_s, self.initial_backoff_s * (2 ** len(self._times)))

    def record(self, now: float) -> None:
        self._forget_old(now)
        self._times.append(now)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


class Supervisor:
    def __init__(
        self,
        cluster: LocalCluster,
        restart: str = "on-failure",
        out: TextIO | None = None,
        max_restarts: int = 5,
        window_s: float = 60.0,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        poll_s: float = 0.2,
        log_lines: int = 15,
    ):
        if restart not in RESTART_POLICIES:
            raise ValueError(f"restart policy must be one of {RESTART_POLICIES}")
        self.cluster = cluster
        self.restart = restart
        self.out = out or sys.stdout
        self.poll_s = poll_s
        self.log_lines = log_lines
        self.budgets = {
            n.name: RestartBudget(max_restarts, window_s, initial_backoff_s, max_backoff_s)
            for n in cluster.nodes
        }
        self.pending: dict[str, float] = {}  # name -> monotonic time of its restart
        self.watched: set[str] = set()  # members started and not yet seen exiting

    def say(self, text: str) -> None:
        print(f"raftkv: {text}", file=self.out, flush=True)

    def start(self) -> None:
        self.cluster.start()
        self.watched = {n.name for n in self.cluster.nodes}

    def run(self) -> int:
        """Supervise until Ctrl-C / SIGTERM (0) or until nothing is left to run (1)."""
        try:
            while True:
                now = time.monotonic()
                for node in self.cluster.nodes:
                    self._check(node, now)
                if not self.watched and not self.pending:
                    self.say("no member is running and none will be restarted; exiting")
                    return 1
                time.sleep(self.poll_s)
        except KeyboardInterrupt:
            self.say("stopping the cluster")
            return 0
        finally:
            self.cluster.stop()

    def _check(self, node: NodeProcess, now: float) -> None:
        due = self.pending.get(node.name)
        if due is not None:
            if now >= due:
                del self.pending[node.name]
                proc = self.cluster.start_node(node)
                self.watched.add(node.name)
                self.say(f"{node.name} restarted (pid {proc.pid}); it catches up from the others")
            return
        if node.name not in self.watched or node.proc is None or node.proc.poll() is None:
            return
        self.watched.discard(node.name)
        code = node.proc.returncode
        tail = self.cluster.log_tail(node, self.log_lines)
        self.say(
            f"{node.name} (pid {node.proc.pid}) {describe_exit(code)}; the other "
            f"members keep serving. Last lines of {node.log_path}:\n{tail}"
        )
        by_hand = f"start it again by hand with:\n  {node.command_line()}"
        if self.restart == "no":
            self.say(f"{node.name} is not restarted (--restart no); {by_hand}")
            return
        if code == 0:
            self.say(f"{node.name} stopped cleanly (status 0), so it is not restarted; {by_hand}")
            return
        budget = self.budgets[node.name]
        delay = budget.next_delay(now)
        if delay is None:
            self.say(
                f"{node.name} failed {budget.max_restarts} times within "
                f"{budget.window_s:.0f} s; giving up restarting it (see its log). Fix the "
                f"cause, then {by_hand}"
            )
            return
        budget.record(now)
        self.pending[node.name] = now + delay
        self.say(
            f"restarting {node.name} in {delay:g} s (--restart on-failure: at most "
            f"{budget.max_restarts} restarts in {budget.window_s:.0f} s, the delay "
            f"doubling up to {budget.max_backoff_s:g} s)"
        )
