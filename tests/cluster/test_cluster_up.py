"""``raftkv cluster up`` is a supervisor: a member's death does not stop the cluster.

The slow tests run ``python -m kvserver.cli cluster up --base-port 0`` as a real process
(free ports, a temp data dir), read the pids, URLs and commands it prints, SIGKILL a member
and check that writes go on through the other two, that the member comes back (restarted by
the supervisor, or with ``--restart no`` by the exact command the supervisor printed) and
catches up: its own serializable read shows a key written while it was dead. Ctrl-C (SIGINT)
then stops everything with status 0. The restart budget's arithmetic is tested without
processes, and the supervisor's decisions (restart within the budget, give up, leave a
cleanly stopped member or any member under ``--restart no`` down) with members that exit at
once (fast tests). Every wait is a bounded poll.
"""

import io
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from kvserver.localcluster.launcher import LocalCluster
from kvserver.localcluster.supervisor import RestartBudget, Supervisor, describe_exit
from tests.cluster.cluster_up import ClusterUp, gone
from tests.cluster.harness import get, put
from tests.support.procs import stop_process
from tests.support.wait import wait_for

RESTARTED = re.compile(r"^raftkv: (node\d+) restarted \(pid (\d+)\)")
CATCH_UP_S = 60.0


def test_restart_budget_backs_off_then_gives_up_then_forgets():
    b = RestartBudget(max_restarts=3, window_s=60.0, initial_backoff_s=1.0, max_backoff_s=3.0)
    delays = []
    for t in (0.0, 1.0, 2.0):
        delays.append(b.next_delay(t))
        b.record(t)
    assert delays == [1.0, 2.0, 3.0]  # doubling, capped at max_backoff_s
    assert b.next_delay(10.0) is None  # 3 restarts within 60 s: give up
    assert b.next_delay(60.5) == 3.0  # the first left the window: 1 s * 2**2, capped
    assert b.next_delay(200.0) == 1.0  # a member that stayed up starts from scratch


def test_describe_exit_names_the_signal():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def write_via(urls: list[str], key: str, value: str, timeout_s: float = 30.0) -> None:
    """Put through any of ``urls``, retrying (bounded) while a new leader is elected."""

    def attempt():
        for url in urls:
            try:
                put(url, key, value, timeout_s=5.0)
                return True
            except (AssertionError, OSError):
                continue
        return False

    wait_for(attempt, timeout_s, f"put {key} through {urls}", interval_s=0.2)


def kill_leader_and_write(up: ClusterUp, tag: str) -> tuple[str, list[str]]:
    up.wait_healthy()
    victim = up.leader()
    others = [n for n in up.nodes if n != victim]
    write_via(up.urls(), f"{tag}/before", "1")
    os.kill(up.nodes[victim]["pid"], signal.SIGKILL)
    up.wait_line(
        re.compile(
            rf"^raftkv: {victim} \(pid \d+\) was killed by SIGKILL; the "
            "other members keep serving"
        ),
        30,
    )
    for i in range(5):  # writes continue through the other two
        write_via(up.urls(others), f"{tag}/while-dead/{i}", str(i))
    assert up.leader(others) in others
    for url in up.urls(others):
        assert get(url, f"{tag}/while-dead/4") == "4"
    return victim, others


def wait_caught_up(up: ClusterUp, name: str, key: str, value: str) -> None:
    url = up.nodes[name]["url"]

    def has_it():
        try:
            return get(url, key, serializable=True, timeout_s=2.0) == value
        except (AssertionError, OSError):
            return False

    wait_for(
        has_it,
        CATCH_UP_S,
        f"{name} to apply {key} (serializable read)\n{up.output()}",
        interval_s=0.2,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_leader_is_restarted_and_catches_up(tmp_path):
    up = ClusterUp(str(tmp_path / "cluster"))
    pids = [n["pid"] for n in up.nodes.values()]
    try:
        for node in up.nodes.values():  # each member's log starts with its exact command
            with open(node["log"]) as f:
                assert node["command"] in f.read(), node["log"]
            assert shlex.split(node["command"])[1] == "serve"
        mark = len(up.lines)
        victim, others = kill_leader_and_write(up, "a")
        assert "restarting " + victim in up.output()
        m = up.wait_line(RESTARTED, 60, start=mark)
        assert m.group(1) == victim
        new_pid = int(m.group(2))
        assert new_pid != up.nodes[victim]["pid"]
        wait_caught_up(up, victim, "a/while-dead/4", "4")
        up.wait_healthy()
        write_via([up.nodes[victim]["url"]], "a/after", "ok")  # and it serves writes again
        for url in up.urls(others):
            assert get(url, "a/after") == "ok"
        pids.append(new_pid)
    finally:
        status = up.stop()
    assert status == 0, up.output()
    assert "stopping the cluster" in up.output()
    wait_for(lambda: all(gone(p) for p in pids), 30, "every member to exit")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restart_no_prints_the_command_that_brings_the_member_back(tmp_path):
    up = ClusterUp(str(tmp_path / "cluster"), "--restart", "no")
    by_hand = None
    try:
        mark = len(up.lines)
        victim, others = kill_leader_and_write(up, "b")
        m = up.wait_line(
            re.compile(
                rf"^raftkv: {victim} is not restarted \(--restart no\); "
                "start it again by hand with:"
            ),
            30,
            start=mark,
        )
        assert m
        idx = next(i for i, line in enumerate(up.lines) if i >= mark and "is not restarted" in line)
        command = up.lines[idx + 1].strip()
        assert command == up.nodes[victim]["command"]
        assert not any(RESTARTED.search(line) for line in up.lines[mark:])
        # The printed command, run as printed (from another directory), brings it back.
        by_hand = subprocess.Popen(
            shlex.split(command),
            cwd=str(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_caught_up(up, victim, "b/while-dead/4", "4")
        up.wait_healthy()
        assert by_hand.poll() is None
    finally:
        if by_hand is not None:
            stop_process(by_hand, 30)
        status = up.stop()
    assert status == 0, up.output()


def _crashing_cluster(tmp_path, code: int) -> LocalCluster:
    """Members whose program exits with ``code`` at once (``python -c ... serve <flags>``)."""
    return LocalCluster(
        str(tmp_path / "c"), size=2, program=[sys.executable, "-c", f"import sys; sys.exit({code})"]
    )


def test_supervisor_restarts_a_failing_member_within_its_budget_then_gives_up(tmp_path):
    out = io.StringIO()
    cluster = _crashing_cluster(tmp_path, 3)
    sup = Supervisor(
        cluster,
        out=out,
        max_restarts=2,
        window_s=60.0,
        initial_backoff_s=0.01,
        max_backoff_s=0.02,
        poll_s=0.01,
    )
    sup.start()
    assert sup.run() == 1
    text = out.getvalue()
    for node in cluster.nodes:
        assert text.count(f"raftkv: {node.name} restarted") == 2, text
        assert text.count(f"{node.name} (pid") == 3, text  # three exits reported
        assert f"{node.name} failed 2 times within 60 s; giving up" in text, text
        assert node.command_line() in text
        with open(node.log_path) as f:  # one header per start, each with the command
            assert f.read().count(node.command_line()) == 3
    assert "exited with status 3" in text
    assert text.rstrip().endswith("no member is running and none will be restarted; exiting")


@pytest.mark.parametrize("policy", ["on-failure", "no"])
def test_supervisor_leaves_down_a_member_that_stopped_cleanly_or_under_restart_no(tmp_path, policy):
    out = io.StringIO()
    cluster = _crashing_cluster(tmp_path, 0 if policy == "on-failure" else 5)
    sup = Supervisor(cluster, restart=policy, out=out, initial_backoff_s=0.01, poll_s=0.01)
    sup.start()
    assert sup.run() == 1
    text = out.getvalue()
    assert not any(RESTARTED.search(line) for line in text.splitlines()), text
    assert "restarting" not in text, text
    for node in cluster.nodes:
        assert f"start it again by hand with:\n  {node.command_line()}" in text, text
