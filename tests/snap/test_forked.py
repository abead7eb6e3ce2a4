"""snap.forked: work done by a forked child on the state of the moment of the fork."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from snap import forked
from snap.forked import ChildFailedError, ForkedChild

pytestmark = pytest.mark.skipif(not forked.available(), reason="needs fork and pidfd")


def _run(child: ForkedChild, timeout_s: float | None = 30) -> None:
    asyncio.run(child.wait(timeout_s))


def test_the_child_writes_what_the_state_was_at_the_fork(tmp_path):
    state = [b"a", b"b"]
    out = tmp_path / "out"

    def work():
        out.write_bytes(b"".join(state))

    async def main():
        child = ForkedChild.start(work)
        state.append(b"c")  # the parent goes on changing its state at once
        state[0] = b"z"
        assert 0 < child.fork_s < 30  # how long the parent spent in the fork, for its log
        await child.wait(30)

    asyncio.run(main())
    assert out.read_bytes() == b"ab"


def test_the_loop_keeps_running_while_the_child_works():
    async def main():
        child = ForkedChild.start(lambda: time.sleep(0.25))
        task = asyncio.ensure_future(child.wait(30))
        turns = 0
        while not task.done():
            turns += 1
            await asyncio.sleep(0.005)
        await task
        return turns

    assert asyncio.run(main()) > 5  # the loop turned while the child slept


def test_a_failing_child_is_an_error_in_the_parent(capfd):
    def broken():
        raise RuntimeError("the work broke")

    with pytest.raises(ChildFailedError, match="exit code 3"):
        _run(ForkedChild.start(broken))
    assert "the work broke" in capfd.readouterr().err  # the child's traceback


def test_the_child_holds_none_of_the_parents_descriptors(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    out = tmp_path / "fds"

    def work():
        fds = os.listdir("/proc/self/fd")  # opened after the inherited ones were closed
        with open(out, "w") as f:
            f.write(" ".join(fds))

    try:
        _run(ForkedChild.start(work))
    finally:
        listener.close()
    fds = sorted(int(fd) for fd in out.read_text().split())
    # stdin, stdout, stderr, and the directory listdir had open
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4, fds


def test_a_child_past_its_time_is_killed():
    child = ForkedChild.start(lambda: time.sleep(60))
    with pytest.raises(ChildFailedError, match="did not finish"):
        _run(child, timeout_s=0.2)
    with pytest.raises(ChildProcessError):  # killed and reaped
        os.waitpid(child.pid, os.WNOHANG)


def test_cancelling_the_wait_kills_the_child():
    async def main():
        child = ForkedChild.start(lambda: time.sleep(60))
        task = asyncio.ensure_future(child.wait())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return child.pid

    pid = asyncio.run(main())
    with pytest.raises(ChildProcessError):  # killed and reaped
        os.waitpid(pid, os.WNOHANG)
