"""Child processes of a test's event loop, never waited on unbounded.

In-process members run on the test's loop, so a test that runs a client program (etcdctl,
``python -m kvserver.cli``, a client script) must not block that loop: these helpers use
asyncio's subprocesses.

``run(argv, timeout_s, env=None, cwd=None)`` runs ``argv`` to its end with stdin from
/dev/null and returns its exit code, stdout and stderr (as text). If it has not ended after
``timeout_s`` it is killed and reaped, and ``TimeoutError`` propagates (the test fails).
``stop(proc, timeout_s)`` kills a process that still runs and reaps it (fails after
``timeout_s``); one that has ended is only reaped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence


async def run(
    argv: Sequence[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv`` run to its end within ``timeout_s``."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def stop(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """Kill ``proc`` unless it has ended, and reap it."""
    if proc.returncode is None:
        proc.kill()
    await asyncio.wait_for(proc.wait(), timeout_s)
