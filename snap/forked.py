"""Work done by a forked child process on a copy-on-write image of this one.

Why: serializing a store of a million keys and writing it out is seconds of CPU and hundreds
of megabytes of file writes. Done by the member itself (on its event loop in 64 KiB steps,
the file by one of its threads) it never holds the loop long, but every step is one the
member's puts wait behind, and a thread writing a big file takes the interpreter lock back
after each write. A child made by ``fork`` sees the parent's memory as it was at the fork,
copy-on-write, so it can serialize that state and write the file at its own pace, at a lower
CPU priority, while the parent goes on applying. The parent pays for the fork (the page
tables, on its own thread: 20-30 ms per GiB of heap on the 2-core test machine when
quiet, 25-47 ms for a member of 1 GiB under load, 40-90 ms for 1.7 GiB; ``fork_s`` says how
long) and for copying the pages it writes to while the child runs; the child's own copies
die with it.

Contract: ``ForkedChild.start(work)`` freezes the parent's cyclic GC (``gc.freeze``, see
``start``) and forks at once; the child runs ``work()`` (it sees the
state of the moment of the call) and exits 0 when it returns, 3 when it raised (its traceback
goes to the inherited stderr). ``await child.wait(timeout_s)`` waits for the exit without
blocking the event loop (a pidfd), and raises ``ChildFailedError`` for anything but a clean
exit, or after ``timeout_s`` (the child is then killed). ``child.cancel()``, or cancelling
``wait``, kills the child.

The child is careful about what it inherited:
- it closes every file descriptor but stdin/stdout/stderr before ``work`` runs, so it holds
  no listening socket, WAL lock or peer connection of the parent's (a member restarted while
  an orphan child ran would otherwise find its port or its WAL still held); ``work`` opens
  what it needs itself;
- it asks the kernel to kill it when the parent dies (``PR_SET_PDEATHSIG``);
- it runs ``nice``d by ``CHILD_NICENESS``, in a session of its own (see ``run_in_background``),
  with the cyclic GC off (a collection would touch
  every object, and copy every page), and leaves by ``os._exit``: no ``atexit`` handler,
  no buffered-file flush and no event-loop code of the parent's runs in it;
- ``work`` must take no lock another thread of the parent may hold (it would stay held in
  the child forever), and import nothing (the same, for the import lock).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

# How much lower than the member the child runs: on a machine whose cores the members keep
# busy, the snapshot takes longer instead of the members' requests waiting for it.
CHILD_NICENESS = 19

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


class ChildFailedError(Exception):
    """A forked child did not finish its work; the message says how."""


def available() -> bool:
    """Whether this platform can run work in a forked child (Linux: fork and pidfd)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and sys.platform == "linux"


class ForkedChild:
    def __init__(self, pid: int, fork_s: float = 0.0) -> None:
        self.pid = pid
        self.fork_s = fork_s  # how long the parent spent in the fork itself
        self._reaped = False

    @classmethod
    def start(cls, work: Callable[[], object], niceness: int = CHILD_NICENESS) -> ForkedChild:
        parent = os.getpid()
        # Python's own advice for a fork without exec: every object tracked now moves to the
        # permanent generation, so the parent's next collections walk only what it allocates
        # from now on. A full collection over the old objects would write to each one's
        # header, and so copy every page the child still shares, on the parent's loop
        # (measured with a store of a million keys, none of it frozen, putting on a loop:
        # a 0.7 s step after the fork; frozen first, no step longer than without a fork).
        gc.freeze()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _run_child(work, parent, niceness)
        return cls(pid, time.monotonic() - started)

    async def wait(self, timeout_s: float | None = None) -> None:
        try:
            code = await asyncio.wait_for(self._exit_code(), timeout_s)
        except TimeoutError:
            self.cancel()
            raise ChildFailedError(
                f"child {self.pid} did not finish within {timeout_s:.0f} s; killed"
            ) from None
        except BaseException:
            self.cancel()
            raise
        if code != _OK:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            raise ChildFailedError(f"child {self.pid} failed ({how})")

    def cancel(self) -> None:
        """Kill the child if it still runs (idempotent)."""
        if not self._reaped:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._reaped = True

    async def _exit_code(self) -> int:
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


def _run_child(work: Callable[[], object], parent: int, niceness: int) -> None:
    code = _FAILED
    try:
        gc.disable()
        os.closerange(3, 1 << 20)
        die_with(parent)
        run_in_background(niceness)
        work()
        code = _OK
    except BaseException:
        try:  # to the inherited stderr itself: sys.stderr may be a buffer of the parent's
            os.write(2, f"forked child {os.getpid()}: {traceback.format_exc()}".encode())
        except BaseException:
            pass
    finally:
        os._exit(code)


def run_in_background(niceness: int) -> None:
    """Run below every process of the machine's regular work, not only below the parent.

    Where the kernel groups processes by session for scheduling (autogroup), a ``nice``
    counts only inside the group: a child left in its parent's session is charged to the
    parent's share, and the parent's loop then waits for the child's CPU time (measured
    here: loop stalls of 250-310 ms while a child ran). In a session of its own, with the
    group's own niceness (``/proc/self/autogroup``) set too, the child gets what the others
    leave. Where there is no autogroup, the ``nice`` alone does that."""
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(niceness))
    except OSError:  # no autogroup in this kernel: nothing to lower
        pass
    os.nice(niceness)


def die_with(parent: int) -> None:
    """Have the kernel kill this child when its parent dies; exit now if it already has."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # (no prctl: an orphan then runs to its end, holding nothing of the parent's)
    if os.getppid() != parent:
        os._exit(_FAILED)
