"""Messages per round of a loaded leader, a measurement, not a test.

    .venv/bin/python -m tests.raft.bench_messages

Three nodes (tests.raft.harness), 200 rounds. Each round the driver proposes K entries on
the leader (K concurrent clients), every node then handles its Readies, and everything
queued is delivered; every fifth round all nodes tick (heartbeats). Prints, per K, the
leader's MsgApps per follower per round and the most MsgApps one follower got in one Ready.
Deterministic: the numbers only change when the core's behaviour does.
"""

from __future__ import annotations

from collections import Counter

from raft import MessageType
from tests.raft.harness import Cluster

ROUNDS = 200
TICK_EVERY_ROUNDS = 5
FOLLOWERS = (2, 3)


def run(k: int) -> dict[str, float]:
    c = Cluster([1, 2, 3])
    c.elect(1)
    sent: Counter[MessageType] = Counter()
    max_per_ready = 0
    for r in range(ROUNDS):
        for i in range(k):
            c.propose(1, b"%d-%d" % (r, i))
        if r % TICK_EVERY_ROUNDS == 0:
            for i in (1, 2, 3):
                c.tick(i)
        for i in (1, 2, 3):
            while c.node(i).has_ready():
                rd = c.process_ready(i)
                if i != 1:
                    continue
                sent.update(m.type for m in rd.messages)
                for f in FOLLOWERS:
                    n = sum(1 for m in rd.messages if m.to == f and m.type == MessageType.MsgApp)
                    max_per_ready = max(max_per_ready, n)
        c.deliver()
    c.stabilize()
    assert all(c.applied_data(f) == c.applied_data(1) for f in FOLLOWERS)
    return {
        "msgapp_per_follower_per_round": sent[MessageType.MsgApp] / ROUNDS / len(FOLLOWERS),
        "max_msgapp_per_follower_per_ready": max_per_ready,
        "heartbeats": sent[MessageType.MsgHeartbeat],
    }


def main() -> None:
    for k in (1, 4, 16, 64):
        r = run(k)
        print(
            f"K={k:3d}: MsgApp per follower per round {r['msgapp_per_follower_per_round']:.2f}, "
            f"max per follower per Ready {r['max_msgapp_per_follower_per_ready']}, "
            f"heartbeats {r['heartbeats']}"
        )


if __name__ == "__main__":
    main()
