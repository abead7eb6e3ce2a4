"""etcd's ``monitorLeader`` for streams opened with ``hasleader: true``.

A client that opens a stream with the metadata ``hasleader: true`` (clientv3's
``WithRequireLeader``; etcdctl's watch and lease keep-alive send it) wants the stream to end
when the member it talks to has lost its leader, so it can move to another member. As etcd's
stream interceptor does, ``LeaderMonitor`` checks every election timeout (``period_s``) and,
once the member has known no leader ``MAX_NO_LEADER_CHECKS`` times in a row, ends every
registered call with Unavailable ``etcdserver: no leader`` (``call.fail(error)``). One task
serves all such calls of a servicer and runs only while there are some.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.service_errors import no_leader

MAX_NO_LEADER_CHECKS = 3  # etcd's maxNoLeaderCnt
DEFAULT_LEADER_CHECK_S = 1.0  # etcd's default election timeout, if the service has none


class Failable(Protocol):
    def fail(self, error: EtcdError) -> None: ...


class LeaderMonitor:
    def __init__(self, service: Any, name: str) -> None:
        self.service = service
        self.name = name
        self.period_s = float(getattr(service, "election_timeout_s", DEFAULT_LEADER_CHECK_S))
        self.calls: set[Failable] = set()
        self.task: asyncio.Task | None = None

    def add(self, call: Failable) -> None:
        self.calls.add(call)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def discard(self, call: Failable) -> None:
        self.calls.discard(call)
        if not self.calls and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        misses = 0
        while True:
            await asyncio.sleep(self.period_s)
            misses = misses + 1 if self.service.status().leader == 0 else 0
            if misses >= MAX_NO_LEADER_CHECKS:
                for call in list(self.calls):
                    call.fail(no_leader())
