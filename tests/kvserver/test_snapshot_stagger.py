"""Members take their snapshots in turn: each one's threshold is ``--snapshot-count`` plus a
part of up to a quarter of it, fixed by its ID."""

import random

from hypothesis import given
from hypothesis import strategies as st

from kvserver.server.node import snapshot_threshold


@given(node_id=st.integers(1, 2**64 - 1), count=st.integers(1, 10**7))
def test_the_threshold_is_the_count_plus_at_most_a_quarter(node_id, count):
    got = snapshot_threshold(node_id, count)
    assert count <= got <= count + count // 4
    assert got == snapshot_threshold(node_id, count)  # fixed for the member


def test_three_members_snapshot_at_different_points():
    rng = random.Random(7)
    spread = []
    for _ in range(200):
        ids = [rng.getrandbits(64) for _ in range(3)]
        thresholds = sorted(snapshot_threshold(i, 10_000) for i in ids)
        spread.append(thresholds[-1] - thresholds[0])
    # random member IDs: in most clusters the first and last snapshot are far apart
    assert sum(s > 500 for s in spread) >= 150
