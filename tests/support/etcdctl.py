"""etcdctl 3.4 (Debian's ``etcd-client``, the v3 API) as tests run it: ``Etcdctl`` blocks,
``AsyncEtcdctl`` runs it as a child of the test's event loop (in-process members on that loop
go on serving meanwhile).

Both are made from the endpoints etcdctl is given (``--endpoints``, comma-joined: client URLs
or host:port) and global flags, which stand before each command's arguments. The binary is
looked up on PATH when one is made (``require_program``: without it the test is skipped, or
fails when external programs are required). etcdctl's environment is ``ETCDCTL_API=3`` and
``PATH=/usr/bin:/bin`` only, so no ``ETCDCTL_*`` setting of the caller's leaks in. Every run
is bounded by ``timeout_s``: one that takes longer is killed and the test fails.

- ``call(*args)``: the run, whatever its exit code (a ``CompletedProcess``; for
  ``AsyncEtcdctl`` the exit code, stdout and stderr).
- ``run(*args)``: stdout; asserts exit code 0 (the failure shows stderr).
- ``fails(*args)``: stderr; asserts a non-zero exit code (the failure shows stdout).
- ``json(*args)``: ``run("-w", "json", *args)``, decoded.
- ``start(*args)``: etcdctl left running (stdout and stderr piped, in a session of its own),
  for the commands that run until stopped (lock, elect, watch, make-mirror); the caller
  stops it.

Only ``Etcdctl.run``/``call`` take ``stdin`` (text fed to etcdctl); otherwise etcdctl reads
/dev/null (``AsyncEtcdctl.start(stdin=True)`` gives a pipe instead).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.conftest import ETCD_INSTALL, require_program
from tests.support import async_procs

ENV = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
TIMEOUT_S = 30.0


class _Command:
    def __init__(self, endpoints: Sequence[str], *flags: str, timeout_s: float = TIMEOUT_S):
        self.binary = require_program("etcdctl", ETCD_INSTALL)
        self.endpoints = ",".join(endpoints)
        self.flags = flags
        self.timeout_s = timeout_s

    def argv(self, *args: str) -> list[str]:
        return [self.binary, f"--endpoints={self.endpoints}", *self.flags, *args]


class Etcdctl(_Command):
    """etcdctl run to its end, blocking the caller."""

    def call(
        self, *args: str, stdin: str | None = None, timeout_s: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            timeout=self.timeout_s if timeout_s is None else timeout_s,
            env=ENV,
        )

    def run(self, *args: str, stdin: str | None = None) -> str:
        done = self.call(*args, stdin=stdin)
        assert done.returncode == 0, f"etcdctl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def fails(self, *args: str) -> str:
        done = self.call(*args)
        assert done.returncode != 0, f"etcdctl {' '.join(args)} succeeded: {done.stdout}"
        return done.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self.run("-w", "json", *args))

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            start_new_session=True,
        )


class AsyncEtcdctl(_Command):
    """etcdctl as a child of the running event loop."""

    async def call(self, *args: str) -> tuple[int, str, str]:
        return await async_procs.run(self.argv(*args), self.timeout_s, env=ENV)

    async def run(self, *args: str) -> str:
        code, out, err = await self.call(*args)
        assert code == 0, f"etcdctl {' '.join(args)}: exit {code}: {err}"
        return out

    async def fails(self, *args: str) -> str:
        code, out, err = await self.call(*args)
        assert code != 0, f"etcdctl {' '.join(args)} succeeded: {out}"
        return err

    async def json(self, *args: str) -> Any:
        return json.loads(await self.run("-w", "json", *args))

    async def start(self, *args: str, stdin: bool = False) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=ENV,
            start_new_session=True,
        )
