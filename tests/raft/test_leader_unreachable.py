"""A follower told that its leader is unreachable (the transport lost the connection: the
leader's process most likely died) campaigns as soon as the voters' leases allow, instead of
waiting out a randomized election timeout of up to two election timeouts. Timing only:
PreVote and CheckQuorum still decide, and a hint about a live leader changes nothing."""

from raft import StateType
from tests.raft.harness import Cluster

ET = 10  # the harness's election timeout in ticks


def _cluster(seed: int) -> Cluster:
    c = Cluster([1, 2, 3], pre_vote=True, check_quorum=True, election_tick=ET, seed=seed)
    c.elect(1)
    return c


def _ticks_until_a_new_leader(c: Cluster, limit: int) -> int | None:
    for n in range(1, limit + 1):
        c.tick(2)
        c.tick(3)
        c.stabilize()
        if any(c.raft(i).state == StateType.LEADER for i in (2, 3)):
            return n
    return None


def test_a_hinted_follower_campaigns_within_one_and_a_half_election_timeouts():
    """Without the hint the randomized timeout is anywhere in [et, 2 et); with it, at most
    et + 1 + et/2 - 1 ticks, and never longer than it was."""
    shortened = 0
    for seed in range(1, 60):
        c = _cluster(seed)
        before = c.raft(2).randomized_election_timeout
        c.node(2).report_unreachable(1)
        after = c.raft(2).randomized_election_timeout
        assert after <= min(before, ET + ET // 2), (seed, before, after)
        shortened += after < before
    assert shortened >= 15  # many seeds had drawn a timeout beyond 1.5 et


def test_after_the_hint_the_election_itself_still_runs_pre_vote_and_vote():
    """A hinted follower of a dead leader becomes leader through the normal election, at the
    next term, within the bounded timeout when the other follower did not draw the same tick."""
    c = _cluster(3)
    term = c.raft(1).term
    c.isolate(1)
    c.node(2).report_unreachable(1)
    n = _ticks_until_a_new_leader(c, 4 * ET)
    assert n is not None and n <= ET + ET // 2
    (leader,) = [i for i in (2, 3) if c.raft(i).state == StateType.LEADER]
    assert c.raft(leader).term == term + 1


def test_a_hint_about_a_live_leader_disrupts_nothing():
    c = _cluster(5)
    term = c.raft(1).term
    for i in (2, 3):
        c.node(i).report_unreachable(1)
    c.tick_all(6 * ET)  # heartbeats keep flowing: the followers never campaign
    assert c.leaders() == [1]
    assert all(c.raft(i).term == term for i in (1, 2, 3))


def test_a_hint_about_a_peer_that_is_not_the_leader_is_ignored():
    c = _cluster(7)
    before = c.raft(2).randomized_election_timeout
    c.node(2).report_unreachable(3)
    assert c.raft(2).randomized_election_timeout == before


def test_a_hinted_pre_candidate_ignored_by_a_voter_in_its_lease_asks_again_soon():
    """A voter that heard the leader less than an election timeout ago ignores pre-votes (no
    answer). Without a retry the pre-candidate would wait a whole new timeout; after the hint
    it asks again every couple of ticks, so the election ends soon after the voter's lease."""
    c = _cluster(11)
    c.isolate(1)
    c.node(2).report_unreachable(1)
    # Node 2 reaches its hinted timeout while node 3, not ticked, is still in its lease.
    for _ in range(ET + ET // 2 + 1):
        c.tick(2)
        c.stabilize()
        if c.raft(2).state == StateType.PRE_CANDIDATE:
            break
    assert c.raft(2).state == StateType.PRE_CANDIDATE
    assert c.raft(3).election_elapsed < ET  # node 3 ignored the pre-vote
    ticks = 0
    while c.raft(2).state != StateType.LEADER and ticks < 2 * ET:
        ticks += 1
        c.tick(2)
        c.tick(3)
        c.stabilize()
    assert c.raft(2).state == StateType.LEADER
    # Node 3's lease ends after ET ticks; the retry wins within a few ticks of that, before
    # node 2's own next timeout (>= et + 1 ticks after its first pre-vote) would fire.
    assert ticks <= ET, ticks


def test_two_pre_candidates_of_the_same_round_do_not_split_the_vote():
    """Both followers of a dead leader campaign on the same tick (the harness ticks them in
    lockstep). Without a tie-break both win the pre-election, both vote for themselves and
    the election fails, costing a new randomized timeout; with it the lower id wins at once,
    at the next term."""
    for seed in range(1, 30):
        c = _cluster(seed)
        term = c.raft(1).term
        c.isolate(1)
        for i in (2, 3):
            c.raft(i).randomized_election_timeout = ET + 1
        n = _ticks_until_a_new_leader(c, 4 * ET)
        assert n is not None and n <= ET + 2, (seed, n)
        assert c.leaders() in ([1, 2], [2]) and c.raft(2).term == term + 1, seed
