"""Bounded polling: wait until a condition holds, or fail saying what was awaited.

``wait_for(predicate, timeout_s, what)`` calls ``predicate()`` every ``interval_s`` until it
returns a truthy value, and returns that value. If ``timeout_s`` passes first it raises
``WaitTimeout`` (an ``AssertionError``, so it reads as a test failure) naming ``what``, the
time waited and the predicate's last answer. Exceptions of the types in ``ignore`` count as
"not yet" (the last one is named in the failure); any other exception propagates at once.

``async_wait_for`` is the same inside an event loop: it sleeps with ``asyncio.sleep`` (other
tasks run meanwhile) and measures time on the loop's clock. The predicate stays a plain
function; it is called on the loop's thread.

Nothing here sleeps a fixed time to hide a race: every wait ends as soon as the condition
holds, and never later than its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

SYNC_INTERVAL_S = 0.05  # sync waits mostly poll other processes (HTTP, /proc): not too often
ASYNC_INTERVAL_S = 0.02  # async waits poll in-process state: cheap


class WaitTimeout(AssertionError):
    """A bounded wait ran out of time."""


def _failure(timeout_s: float, what: str, last: Any, error: BaseException | None) -> WaitTimeout:
    text = f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r:.300})"
    if error is not None:
        text += f" (last error: {error!r:.300})"
    return WaitTimeout(text)


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = SYNC_INTERVAL_S,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """``predicate()``'s first truthy value, polled every ``interval_s`` for ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last = predicate()
        except ignore as exc:
            last, error = None, exc
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _failure(timeout_s, what, last, error)
        time.sleep(interval_s)


async def async_wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = ASYNC_INTERVAL_S,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """As ``wait_for``, sleeping with ``asyncio.sleep`` on the running loop's clock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last = predicate()
        except ignore as exc:
            last, error = None, exc
        if last:
            return last
        if loop.time() >= deadline:
            raise _failure(timeout_s, what, last, error)
        await asyncio.sleep(interval_s)
