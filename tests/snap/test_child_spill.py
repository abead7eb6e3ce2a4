"""snap.child_spill: an image produced by a forked child, as it was at the fork."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from snap import child_spill
from snap.child_spill import ChildSpill, ChildSpillError

pytestmark = pytest.mark.skipif(not child_spill.available(), reason="needs fork and pidfd")


def _chunks(items: list[bytes]):
    return lambda: iter(list(items))


def test_the_image_is_every_chunk_in_order(tmp_path):
    parts = [os.urandom(n) for n in (0, 1, 65536, 5 << 20, 17)]

    async def main():
        return bytes(await ChildSpill.start(_chunks(parts), str(tmp_path)).result())

    assert asyncio.run(main()) == b"".join(parts)
    assert os.listdir(tmp_path) == []  # the spill file is anonymous


def test_the_child_sees_the_state_of_the_fork_not_later_changes():
    state = [b"a", b"b"]

    async def main():
        spill = ChildSpill.start(lambda: iter(state))
        state.append(b"c")  # the parent goes on changing its state at once
        state[0] = b"z"
        return bytes(await spill.result())

    assert asyncio.run(main()) == b"ab"


def test_the_loop_keeps_running_while_the_child_works():
    def slow():
        for _ in range(5):
            time.sleep(0.05)
            yield b"x"

    async def main():
        spill = ChildSpill.start(slow)
        turns = 0
        task = asyncio.ensure_future(spill.result())
        while not task.done():
            turns += 1
            await asyncio.sleep(0.005)
        return await task, turns

    image, turns = asyncio.run(main())
    assert bytes(image) == b"xxxxx"
    assert turns > 5  # the loop turned while the child slept


def test_a_failing_producer_is_an_error_in_the_parent(capfd):
    def broken():
        yield b"ok"
        raise RuntimeError("the producer broke")

    async def main():
        await ChildSpill.start(broken).result()

    with pytest.raises(ChildSpillError, match="exit code 3"):
        asyncio.run(main())
    assert "the producer broke" in capfd.readouterr().err  # the child's traceback


def test_the_child_holds_none_of_the_parents_descriptors():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:

        def open_fds():
            yield " ".join(sorted(os.listdir("/proc/self/fd"), key=int)).encode()

        async def main():
            return bytes(await ChildSpill.start(open_fds).result()).decode().split()

        fds = [int(fd) for fd in asyncio.run(main())]
    finally:
        listener.close()
    assert listener.fileno() == -1
    # stdin, stdout, stderr, the spill file, and the directory listdir has open
    assert len(fds) <= 5, fds
    assert fds[:3] == [0, 1, 2]


def test_cancel_kills_the_child(tmp_path):
    def forever():
        while True:
            time.sleep(0.05)
            yield b""

    async def main():
        spill = ChildSpill.start(forever, str(tmp_path))
        task = asyncio.ensure_future(spill.result())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return spill.pid

    pid = asyncio.run(main())
    with pytest.raises(ChildProcessError):  # killed and reaped
        os.waitpid(pid, os.WNOHANG)
