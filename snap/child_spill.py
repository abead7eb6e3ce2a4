"""A snapshot image produced by a forked child process into a ``SpillFile``.

Why: serializing a store of a million keys is a few seconds of CPU (300 MB of msgpack). Done
on the member's event loop in 64 KiB steps it never holds the loop long, but every step it
takes is a step the member's puts wait behind, and on a busy machine that showed as put
latency for as long as the snapshot ran. A child made by ``fork`` sees the parent's memory
as it was at the fork, copy-on-write, so it can serialize that state at its own pace, at a
lower CPU priority, while the parent goes on applying. The parent pays for the fork (page
tables: a few milliseconds per GiB of heap) and for copying the pages it writes to while
the child runs; the child's own copies die with it.

Contract: ``ChildSpill.start(produce, directory)`` forks at once; the child calls
``produce()`` (it sees the state of the moment of the call, which is what the image holds)
and appends its chunks to an anonymous ``SpillFile`` in ``directory``, then exits.
``await spill.result()`` waits for the child without blocking the event loop and returns the
mapped image (as ``snap.spill.spill_chunks`` does), or raises ``ChildSpillError`` if the
child failed or was killed. ``spill.cancel()`` (or cancelling ``result``) kills the child.

The child is careful about what it inherited:
- it closes every file descriptor but stdin/stdout/stderr and the spill file, so it holds
  no listening socket, WAL lock or peer connection of the parent's (a member restarted while
  an orphan child ran would otherwise find its port or its WAL still held);
- it asks the kernel to kill it when the parent dies (``PR_SET_PDEATHSIG``);
- it runs ``nice``d by ``CHILD_NICENESS``, with the cyclic GC off (a collection would touch
  every object, and copy every page), and leaves by ``os._exit``: no ``atexit`` handler,
  no buffered-file flush and no event-loop code of the parent's runs in it.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable

from snap.spill import SPILL_BATCH_BYTES, SpillFile

# How much lower than the member the child runs: on a machine whose cores the members keep
# busy, the snapshot takes longer instead of the members' requests waiting for it.
CHILD_NICENESS = 10

_PR_SET_PDEATHSIG = 1

# Loaded here, in the parent: a dlopen in a child forked from a threaded process could wait
# forever for a loader lock some other thread held at the fork.
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None

# Exit codes of the child; anything else is a signal or an interpreter failure.
_OK = 0
_FAILED = 3


class ChildSpillError(Exception):
    """The child that produced an image failed; the message says how."""


def available() -> bool:
    """Whether this platform can make images in a child (Linux: fork and pidfd)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and sys.platform == "linux"


class ChildSpill:
    def __init__(self, pid: int, spill: SpillFile) -> None:
        self.pid = pid
        self._spill = spill
        self._reaped = False

    @classmethod
    def start(
        cls,
        produce: Callable[[], Iterable[bytes]],
        directory: str | None = None,
        niceness: int = CHILD_NICENESS,
    ) -> ChildSpill:
        spill = SpillFile(directory)
        parent = os.getpid()
        try:
            pid = os.fork()
        except BaseException:
            spill.close()
            raise
        if pid == 0:  # the child: never returns
            _run_child(produce, spill, parent, niceness)
        return cls(pid, spill)

    async def result(self) -> memoryview:
        try:
            code = await self._wait()
        except BaseException:
            self.cancel()
            raise
        if code != _OK:
            self._spill.close()
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            raise ChildSpillError(f"snapshot child {self.pid} failed ({how})")
        # The child wrote through its own copy of the file object: size it from the file.
        self._spill.size = os.fstat(self._spill.fileno()).st_size
        return self._spill.map()

    def cancel(self) -> None:
        """Kill the child if it still runs and drop the file (idempotent)."""
        if not self._reaped:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._reaped = True
        self._spill.close()

    async def _wait(self) -> int:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self.pid)
        try:
            exited = loop.create_future()

            def readable() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(pidfd, readable)
            try:
                await exited
            finally:
                loop.remove_reader(pidfd)
        finally:
            os.close(pidfd)
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped by someone else: its status is lost
            self._reaped = True
            return _FAILED
        self._reaped = True
        return os.waitstatus_to_exitcode(status)


def _run_child(
    produce: Callable[[], Iterable[bytes]], spill: SpillFile, parent: int, niceness: int
) -> None:
    code = _FAILED
    try:
        gc.disable()
        keep = spill.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 20)
        _die_with(parent)
        os.nice(niceness)
        batch: list[bytes] = []
        batch_bytes = 0
        for chunk in produce():
            batch.append(chunk)
            batch_bytes += len(chunk)
            if batch_bytes >= SPILL_BATCH_BYTES:
                spill.append(batch)
                batch, batch_bytes = [], 0
        spill.append(batch)
        code = _OK
    except BaseException:
        try:  # to the inherited stderr itself: sys.stderr may be a buffer of the parent's
            os.write(2, f"snapshot child {os.getpid()}: {traceback.format_exc()}".encode())
        except BaseException:
            pass
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """Have the kernel kill this child when its parent dies; exit now if it already has."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # (no prctl: an orphan then runs to its end, holding nothing of the parent's)
    if os.getppid() != parent:
        os._exit(_FAILED)
