"""Runs a server process's main coroutine on uvloop, under cProfile when asked.

Contract: ``run_main(coro, profile_name)`` runs ``coro`` to its end on a uvloop event loop
(asyncio's own when uvloop cannot be imported) and returns its result. With
``RAFTKV_PROFILE_DIR`` set in the environment, the whole run is profiled with cProfile and
written at the end, however the coroutine ends, to ``$RAFTKV_PROFILE_DIR/<profile_name>.prof``
(read it with ``python -m pstats``). The profile times the loop thread's CPU, not the wall
clock: on a shared machine a process that waits for a core would otherwise charge the wait
to whatever it was running. A member and each client front end run through it, so a profile
of a cluster under load covers every server process.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

PROFILE_DIR_ENV = "RAFTKV_PROFILE_DIR"


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but optional at runtime
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def run_main(coro: Coroutine[Any, Any, T], profile_name: str) -> T:
    profile_dir = os.environ.get(PROFILE_DIR_ENV)
    with _runner() as runner:
        if not profile_dir:
            return runner.run(coro)
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        try:
            return profiler.runcall(runner.run, coro)
        finally:
            os.makedirs(profile_dir, exist_ok=True)
            profiler.dump_stats(os.path.join(profile_dir, f"{profile_name}.prof"))
