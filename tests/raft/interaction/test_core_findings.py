"""Behaviour of the raft core that the interaction traces exposed as questionable.

Each finding is a minimal reproduction marked ``xfail(strict=True)``: it asserts the
behaviour we expect (etcd's), fails today, and turns into an unexpected pass — a failure
under ``strict`` — the day the core changes, so the marker cannot outlive the fix. The
traces showing the current behaviour are kept out of testdata/ on purpose (they would pin
it).
"""

import pytest

from raft import ProgressState
from tests.raft.interaction.commands import execute
from tests.raft.interaction.datadriven import parse_command
from tests.raft.interaction.env import InteractionEnv


def _run(env: InteractionEnv, *lines: str) -> None:
    for i, line in enumerate(lines):
        execute(env, parse_command(line, f"inline:{i + 1}"))


@pytest.mark.xfail(
    strict=True,
    reason=(
        "core: a heartbeat response does not move a caught-up follower in StateProbe back "
        "to StateReplicate (etcd v3.6: MsgHeartbeatResp sends an append when "
        "pr.State == StateProbe, and an ack of exactly pr.Match moves a probing follower "
        "to StateReplicate); the follower then gets one MsgApp per round trip on the "
        "next writes"
    ),
)
def test_heartbeat_response_returns_caught_up_probing_follower_to_replicate() -> None:
    env = InteractionEnv()
    _run(
        env,
        "log-level none",
        "add-nodes 3 voters=(1,2,3) index=10",
        "campaign 1",
        "stabilize",
        # The transport reports node 2 unreachable although it has the whole log.
        "report-unreachable 1 2",
        "tick-heartbeat 1",
        "stabilize",
        "tick-heartbeat 1",
        "stabilize",
    )
    progress = env.node(1).rawnode.status().progress
    assert progress[2].match == progress[1].match  # caught up all along
    assert progress[2].state == ProgressState.REPLICATE
    # And therefore two proposals go out to it at once, without waiting for an answer.
    _run(env, "propose 1 a", "propose 1 b", "process-ready 1")
    sent_to_2 = [m for m in env.messages if m.to == 2 and m.entries]
    assert len(sent_to_2) == 2
