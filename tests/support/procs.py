"""Stopping child processes: ask first, then kill, never wait unbounded.

``stop_process(proc, timeout_s)`` sends ``sig`` (SIGTERM unless told) to a running process,
waits up to ``timeout_s`` for it to exit, and SIGKILLs it if it has not. ``stop_processes``
does the same for several at once: all are signalled first, then they share one deadline. A
process paused with SIGSTOP is sent SIGCONT first, so it can act on the signal.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable

KILLED_WAIT_S = 30.0  # a SIGKILLed process is gone at once unless the kernel is stuck


def stop_processes(
    procs: Iterable[subprocess.Popen | None],
    timeout_s: float = 20.0,
    sig: int = signal.SIGTERM,
) -> list[bool]:
    """Stop every running process of ``procs`` (None entries are skipped); for each, whether
    it exited by itself (or had already) rather than being killed after ``timeout_s``."""
    procs = list(procs)
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
    deadline = time.monotonic() + timeout_s
    exited = []
    for proc in procs:
        if proc is None:
            exited.append(True)
            continue
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            exited.append(True)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=KILLED_WAIT_S)
            exited.append(False)
    return exited


def stop_process(
    proc: subprocess.Popen, timeout_s: float = 20.0, sig: int = signal.SIGTERM
) -> bool:
    """Stop ``proc`` with ``sig``, SIGKILL after ``timeout_s``; False if it had to be killed."""
    return stop_processes([proc], timeout_s, sig)[0]
