"""Stage marks: when a request passed each stage of a member, for timing one put across
processes (``benchmarks/put_stages.py``).

Off unless the environment variable ``RAFTKV_STAGE_TRACE`` names a directory when the
process starts; then ``mark(stage, tag)`` keeps ``(stage, tag, time.monotonic_ns())`` in
memory and the process writes them to ``<dir>/<pid>.stages`` as it exits, one mark per line.
``time.monotonic_ns`` is the system's CLOCK_MONOTONIC on Linux, one clock for every process
of the machine, so marks of a front end, its member and the member's peers compare.

A call site checks ``ON`` first (``if stages.ON: stages.mark(...)``): off, a mark costs one
attribute read. Marks carry no request id: the benchmark sends one put at a time and takes,
for each put, the first mark of each stage after the put's previous stage.
"""

from __future__ import annotations

import atexit
import os
import time

DIRECTORY = os.environ.get("RAFTKV_STAGE_TRACE", "")
ON = bool(DIRECTORY)
MAX_MARKS = 2_000_000  # a forgotten variable must not grow a member without bound

_marks: list[tuple[str, int, int]] = []


def mark(stage: str, tag: int = 0) -> None:
    if len(_marks) < MAX_MARKS:
        _marks.append((stage, tag, time.monotonic_ns()))


def _write() -> None:
    path = os.path.join(DIRECTORY, f"{os.getpid()}.stages")
    with open(path, "w") as out:
        out.writelines(f"{stage} {tag} {ns}\n" for stage, tag, ns in _marks)


if ON:
    atexit.register(_write)
