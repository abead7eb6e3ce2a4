"""Behaviour of the raft core that the interaction traces exposed as questionable.

Each finding started as a minimal reproduction marked ``xfail(strict=True)`` asserting the
behaviour we expect (etcd's); once the core is fixed it stays here as a plain regression
test, next to a trace in testdata/ that shows the fixed behaviour message by message.
"""

from raft import ProgressState
from tests.raft.interaction.commands import execute
from tests.raft.interaction.datadriven import parse_command
from tests.raft.interaction.env import InteractionEnv


def _run(env: InteractionEnv, *lines: str) -> None:
    for i, line in enumerate(lines):
        execute(env, parse_command(line, f"inline:{i + 1}"))


def test_heartbeat_response_returns_caught_up_probing_follower_to_replicate() -> None:
    """etcd v3.6: a heartbeat response from a follower in StateProbe gets a MsgApp (empty when
    the follower is caught up), and an acknowledgement of exactly ``match`` moves it back to
    StateReplicate; otherwise the follower would get one MsgApp per round trip on the next
    writes. Trace: testdata/heartbeat_resp_recovers_from_probing.txt."""
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
    # And therefore two proposals in two Readies both go out to it, the second without
    # waiting for an answer to the first (StateProbe would hold it back).
    _run(env, "propose 1 a", "process-ready 1", "propose 1 b", "process-ready 1")
    sent_to_2 = [[e.data for e in m.entries] for m in env.messages if m.to == 2]
    assert sent_to_2 == [[b"a"], [b"b"]]
