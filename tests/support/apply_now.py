"""A stand-in for the raft node under a state machine tested without raft.

``ApplyNowNode`` commits every proposal at once: it applies the payload to the state machine
it was bound to (``bind``) at the next index and answers what the state machine answered, as
the node does (an error result is raised). A read barrier is immediate: everything proposed is
applied already. It never leads, so leader-only loops stay idle.
"""

from __future__ import annotations

from typing import Any

from kvserver.server.node import ApplyInSteps
from kvserver.server.replicated_kv import RaftKV


class ApplyNowNode:
    term = 3
    leader = 0
    is_leader = False

    def __init__(self) -> None:
        self.state_machine: Any = None
        self.index = 0

    def bind(self, state_machine: Any) -> Any:
        """Apply proposals to ``state_machine`` from now on; returns it."""
        self.state_machine = state_machine
        return state_machine

    async def propose(self, payload: bytes) -> Any:
        self.index += 1
        result = self.state_machine.apply(self.index, payload)
        if isinstance(result, ApplyInSteps):
            result = await result.run()
        if isinstance(result, Exception):
            raise result
        return result

    async def read_barrier(self) -> int:
        return self.index

    async def wait_recovered(self) -> None:
        return None


def raftkv_without_raft(**options: Any) -> RaftKV:
    """A ``RaftKV`` whose proposals apply at once (no raft, no membership)."""
    node = ApplyNowNode()
    return node.bind(RaftKV(node=node, membership=None, **options))
