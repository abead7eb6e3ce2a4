"""Ctrl-C in tests, whatever SIGINT disposition the test run inherited.

A run started in the background by a script (``make test &``), or by some CI runners,
inherits SIGINT as *ignored*; children inherit that too (exec keeps an ignored signal ignored,
and Python then installs no ``KeyboardInterrupt`` handler), and ``_thread.interrupt_main``
does nothing. So:

- ``python_module(module, *args)``: the argv of ``python -m module args`` for a child that
  will be sent SIGINT; it installs Python's default SIGINT handler before running the module,
  as an interpreter started with SIGINT at its default would have.
- ``default_sigint()``: for an in-process test that simulates Ctrl-C, installs that handler
  in this (main) thread for the duration, and restores what was there.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

_RUN_WITH_DEFAULT_SIGINT = (
    "import runpy, signal; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def python_module(module: str, *args: str) -> list[str]:
    """``[python, -m, module, *args]``, but with SIGINT raising ``KeyboardInterrupt`` in the
    child even when this process ignores SIGINT."""
    # ``python -c CODE args``: sys.argv is ["-c", *args]; run_module(alter_sys=True) puts the
    # module's path in argv[0], so the module sees the argv that ``-m`` would give it.
    return [sys.executable, "-c", _RUN_WITH_DEFAULT_SIGINT.format(module=module), *args]


@contextlib.contextmanager
def default_sigint() -> Iterator[None]:
    """Python's default SIGINT handler in this thread (the main one) for the duration."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
