"""The Raft paper's rules, one test per rule (Ongaro & Ousterhout, "In Search of an
Understandable Consensus Algorithm", 2014), after etcd's raft_paper_test.go.

Each test names the section it pins down. Nodes are RawNodes over MemoryStorage driven by
tests/raft/harness.py; messages are injected or delivered explicitly so each rule is seen in
isolation.
"""

import random

import pytest

from raft import (
    Entry,
    HardState,
    Message,
    MessageType,
    StateType,
)
from tests.raft.harness import Cluster, assert_log_matching, drain, log_of_terms, of_type


def make_candidate(c: Cluster, node_id: int = 1) -> None:
    c.node(node_id).campaign()
    drain(c, node_id)


def make_leader_by_votes(c: Cluster, node_id: int = 1) -> None:
    """Campaign and win by injected votes from every other voter (no network)."""
    make_candidate(c, node_id)
    r = c.raft(node_id)
    for v in sorted(r.tracker.voters - {node_id}):
        c.node(node_id).step(Message(MessageType.MsgVoteResp, to=node_id, frm=v, term=r.term))
    assert r.state == StateType.LEADER


# --- §5.1 terms -------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["follower", "candidate", "leader"])
def test_5_1_higher_term_makes_any_node_a_follower_of_that_term(role):
    """§5.1: "If a server receives a request with a higher term, it updates its current term
    and reverts to follower state"; an AppendEntries names the new leader."""
    c = Cluster([1, 2, 3])
    if role == "candidate":
        make_candidate(c)
    elif role == "leader":
        make_leader_by_votes(c)
        drain(c, 1)
    term = c.raft(1).term
    c.node(1).step(Message(MessageType.MsgApp, to=1, frm=2, term=term + 1))
    r = c.raft(1)
    assert (r.term, r.state, r.lead, r.vote) == (term + 1, StateType.FOLLOWER, 2, 0)


@pytest.mark.parametrize("role", ["follower", "candidate", "leader"])
def test_5_1_higher_term_vote_request_also_updates_term_without_naming_a_leader(role):
    """§5.1: the term update applies to every RPC; a vote request names no leader."""
    c = Cluster([1, 2, 3])
    if role == "candidate":
        make_candidate(c)
    elif role == "leader":
        make_leader_by_votes(c)
    term = c.raft(1).term
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=3, term=term + 5, index=99, log_term=99))
    r = c.raft(1)
    assert (r.term, r.state, r.lead, r.vote) == (term + 5, StateType.FOLLOWER, 0, 3)


def test_5_1_stale_term_requests_are_ignored():
    """§5.1: "If a server receives a request with a stale term number, it rejects the
    request" — nothing is appended and no vote is granted."""
    c = Cluster([1, 2, 3], hard_states={1: HardState(term=2)})
    c.node(1).step(
        Message(MessageType.MsgApp, to=1, frm=2, term=1, entries=(Entry(1, 1, data=b"x"),))
    )
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=3, term=1))
    assert c.raft(1).log.last_index() == 0
    assert c.raft(1).vote == 0
    assert drain(c, 1) == []  # etcd silently ignores (without check_quorum/pre_vote)


def test_5_1_stale_leader_is_told_the_newer_term_when_check_quorum_is_on():
    """§5.1 + thesis §6.2: with CheckQuorum a higher-term node answers a stale leader so it
    steps down (otherwise nothing would ever raise the stale leader's term)."""
    c = Cluster([1, 2, 3], hard_states={1: HardState(term=2)}, check_quorum=True)
    c.node(1).step(Message(MessageType.MsgHeartbeat, to=1, frm=2, term=1))
    (resp,) = drain(c, 1)
    assert (resp.type, resp.to, resp.term) == (MessageType.MsgAppResp, 2, 2)


def test_5_1_servers_start_as_followers():
    """§5.1: "When servers start up, they begin as followers"."""
    c = Cluster([1, 2, 3])
    assert all(c.raft(i).state == StateType.FOLLOWER for i in (1, 2, 3))


def test_5_2_leader_sends_heartbeats_every_heartbeat_interval():
    """§5.2: "Leaders send periodic heartbeats (AppendEntries RPCs that carry no log
    entries) to all followers in order to maintain their authority"; the commit carried is
    capped at what each follower is known to have."""
    c = Cluster([1, 2, 3], heartbeat_tick=2)
    c.elect(1)
    c.tick(1)
    assert of_type(drain(c, 1), MessageType.MsgHeartbeat) == []
    c.tick(1)
    hbs = of_type(drain(c, 1), MessageType.MsgHeartbeat)
    committed = c.raft(1).log.committed
    assert sorted((m.to, m.commit, m.entries) for m in hbs) == [
        (2, committed, ()),
        (3, committed, ()),
    ]


# --- §5.2 leader election ------------------------------------------------------------------


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_5_2_election_timeout_starts_a_new_election(role):
    """§5.2: on election timeout a follower (or a candidate whose election failed)
    "increments its current term and transitions to candidate state. It then votes for itself
    and issues RequestVote RPCs in parallel to each of the other servers"."""
    c = Cluster([1, 2, 3], logs={1: log_of_terms([1, 1])}, hard_states={1: HardState(term=1)})
    if role == "candidate":
        make_candidate(c)
    term = c.raft(1).term
    c.tick(1, 2 * c.raft(1).election_timeout)
    r = c.raft(1)
    assert (r.term, r.state, r.vote) == (term + 1, StateType.CANDIDATE, 1)
    votes = of_type(drain(c, 1), MessageType.MsgVote)
    assert sorted((m.to, m.term, m.index, m.log_term) for m in votes) == [
        (2, term + 1, 2, 1),
        (3, term + 1, 2, 1),
    ]


@pytest.mark.parametrize(
    "size, votes, want",
    [
        (1, {}, StateType.LEADER),
        (3, {2: True, 3: True}, StateType.LEADER),
        (3, {2: True}, StateType.LEADER),
        (5, {2: True, 3: True, 4: True, 5: True}, StateType.LEADER),
        (5, {2: True, 3: True}, StateType.LEADER),
        (3, {2: False, 3: False}, StateType.FOLLOWER),
        (5, {2: True, 3: False, 4: False, 5: False}, StateType.FOLLOWER),
        (3, {}, StateType.CANDIDATE),
        (5, {2: True}, StateType.CANDIDATE),
        (5, {2: False, 3: False}, StateType.CANDIDATE),
    ],
)
def test_5_2_candidate_wins_with_a_majority_and_loses_with_a_majority_of_denials(size, votes, want):
    """§5.2: "A candidate wins an election if it receives votes from a majority of the
    servers in the full cluster for the same term"; it stays candidate until the outcome is
    known; a majority of denials ends the campaign (etcd returns to follower)."""
    c = Cluster(range(1, size + 1))
    make_candidate(c)
    for v, granted in votes.items():
        c.node(1).step(Message(MessageType.MsgVoteResp, to=1, frm=v, term=1, reject=not granted))
    assert c.raft(1).state == want
    assert c.raft(1).term == 1


@pytest.mark.parametrize(
    "voted_for, candidate, reject",
    [(0, 2, False), (0, 3, False), (2, 2, False), (3, 3, False), (2, 3, True), (3, 2, True)],
)
def test_5_2_a_server_votes_at_most_once_per_term(voted_for, candidate, reject):
    """§5.2: "Each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis" (a repeated request from the same candidate is granted
    again, so a lost response can be retried)."""
    c = Cluster([1, 2, 3], hard_states={1: HardState(term=1, vote=voted_for)})
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=candidate, term=1))
    (resp,) = drain(c, 1)
    assert (resp.type, resp.to, resp.term, resp.reject) == (
        MessageType.MsgVoteResp,
        candidate,
        1,
        reject,
    )


def test_5_2_vote_is_persisted_before_the_vote_response_is_sent():
    """§5.2/Figure 2 ("persistent state ... updated on stable storage before responding to
    RPCs"): the Ready that carries a granted MsgVoteResp carries the vote in its HardState and
    demands a sync."""
    c = Cluster([1, 2, 3])
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=2, term=4))
    rd = c.node(1).ready()
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (4, 2)
    assert rd.must_sync
    assert [(m.type, m.reject) for m in rd.messages] == [(MessageType.MsgVoteResp, False)]


@pytest.mark.parametrize("role", ["candidate", "pre_candidate"])
@pytest.mark.parametrize("term_delta", [0, 1])
def test_5_2_candidate_steps_down_on_append_from_a_legitimate_leader(role, term_delta):
    """§5.2: "If the leader's term ... is at least as large as the candidate's current term,
    then the candidate recognizes the leader as legitimate and returns to follower state"."""
    c = Cluster([1, 2, 3], pre_vote=(role == "pre_candidate"))
    make_candidate(c)
    assert c.raft(1).state in (StateType.CANDIDATE, StateType.PRE_CANDIDATE)
    term = c.raft(1).term + term_delta
    c.node(1).step(Message(MessageType.MsgApp, to=1, frm=2, term=max(term, 1)))
    r = c.raft(1)
    assert (r.state, r.lead, r.term) == (StateType.FOLLOWER, 2, max(term, 1))


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_5_2_election_timeouts_are_randomized_over_an_interval(role):
    """§5.2: "election timeouts are chosen randomly from a fixed interval" — etcd uses
    [election_tick, 2*election_tick); every value of that range shows up."""
    et = 10
    seen = set()
    for seed in range(200):
        c = Cluster([1, 2, 3], hard_states={1: HardState(term=1)}, seed=seed, election_tick=et)
        if role == "candidate":
            make_candidate(c)
            c.raft(1).election_elapsed = 0
        term = c.raft(1).term
        ticks = 0
        while c.raft(1).term == term:
            c.tick(1)
            ticks += 1
            assert ticks < 2 * et
        seen.add(ticks)
    assert seen == set(range(et, 2 * et))


def test_5_2_randomized_timeouts_rarely_collide():
    """§5.2: randomization makes split votes rare: among 5 followers, in most rounds one
    server times out alone first (etcd's bound: collisions in < 30% of rounds)."""
    et = 10
    rounds = 300
    collisions = 0
    for seed in range(rounds):
        c = Cluster([1, 2, 3, 4, 5], seed=seed, election_tick=et)
        timed_out = []
        while not timed_out:
            for i in range(1, 6):
                c.tick(i)
                if c.raft(i).state == StateType.CANDIDATE:
                    timed_out.append(i)
        collisions += len(timed_out) > 1
    assert collisions / rounds < 0.3


# --- §5.3 log replication ---------------------------------------------------------------------


def test_5_3_leader_appends_the_command_and_sends_append_entries_in_parallel():
    """§5.3: "The leader appends the command to its log as a new entry, then issues
    AppendEntries RPCs in parallel to each of the other servers", each carrying the index and
    term of the preceding entry and the leader's commit index."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    li = c.raft(1).log.last_index()
    c.propose(1, b"some data")
    rd = c.node(1).ready()
    assert rd.entries == (Entry(1, li + 1, data=b"some data"),)
    apps = of_type(rd.messages, MessageType.MsgApp)
    assert sorted((m.to, m.index, m.log_term, m.commit, m.entries) for m in apps) == [
        (to, li, 1, li, (Entry(1, li + 1, data=b"some data"),)) for to in (2, 3)
    ]


def test_5_3_leader_commits_once_replicated_on_a_majority_and_followers_learn_it():
    """§5.3: "A log entry is committed once the leader that created the entry has replicated
    it on a majority of the servers"; the leader "includes [the commit index] in future
    AppendEntries RPCs ... Once a follower learns that a log entry is committed, it applies
    the entry to its local state machine"."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.cut(1, 3)  # only 2 acknowledges: still a majority with the leader
    li = c.raft(1).log.last_index()
    c.propose(1, b"x")
    c.stabilize()
    assert c.raft(1).log.committed == li + 1
    assert c.applied_data(1) == [b"x"] and c.applied_data(2) == [b"x"]
    assert c.raft(2).log.committed == li + 1
    assert c.applied_data(3) == []


@pytest.mark.parametrize(
    "size, acceptors, committed",
    [
        (1, set(), True),
        (3, set(), False),
        (3, {2}, True),
        (3, {2, 3}, True),
        (5, set(), False),
        (5, {2}, False),
        (5, {2, 3}, True),
        (5, {2, 3, 4, 5}, True),
    ],
)
def test_5_3_leader_commits_only_with_majority_acknowledgement(size, acceptors, committed):
    """§5.3: the commit decision counts the leader plus acknowledging followers against a
    majority of the full cluster."""
    ids = list(range(1, size + 1))
    c = Cluster(ids)
    c.elect(1)
    li = c.raft(1).log.last_index()
    for i in ids[1:]:
        if i not in acceptors:
            c.cut(1, i)
    c.propose(1, b"some data")
    c.stabilize()
    assert (c.raft(1).log.committed > li) == committed


@pytest.mark.parametrize(
    "terms",
    [[], [2], [1, 2], [1]],
)
def test_5_3_committing_an_entry_commits_all_preceding_entries(terms):
    """§5.3: "This also commits all preceding entries in the leader's log, including entries
    created by previous leaders"."""
    ids = [1, 2, 3]
    c = Cluster(
        ids,
        logs={i: log_of_terms(terms) for i in ids},
        hard_states={i: HardState(term=2) for i in ids},
    )
    c.elect(1)
    c.propose(1, b"some data")
    c.stabilize()
    applied = [(e.term, e.index) for e in c.peers[1].applied]
    n = len(terms)
    want = [(t, i + 1) for i, t in enumerate(terms)] + [(3, n + 1), (3, n + 2)]
    assert applied == want
    assert c.peers[1].applied[-1].data == b"some data"


@pytest.mark.parametrize(
    "entries, commit",
    [
        ([Entry(1, 1, data=b"some data")], 1),
        ([Entry(1, 1, data=b"a"), Entry(1, 2, data=b"b")], 2),
        ([Entry(1, 1, data=b"a"), Entry(1, 2, data=b"b")], 1),
        ([Entry(1, 1, data=b"a"), Entry(1, 2, data=b"b")], 5),  # capped at the last new entry
    ],
)
def test_5_3_follower_applies_entries_the_leader_reports_committed(entries, commit):
    """§5.3: "Once a follower learns that a log entry is committed, it applies the entry to
    its local state machine (in log order)"."""
    c = Cluster([1, 2, 3])
    c.node(1).step(
        Message(MessageType.MsgApp, to=1, frm=2, term=1, entries=tuple(entries), commit=commit)
    )
    drain(c, 1)
    want = min(commit, len(entries))
    assert c.raft(1).log.committed == want
    assert c.peers[1].applied == entries[:want]


@pytest.mark.parametrize(
    "log_term, index, want_index, reject, hint, hint_term",
    [
        (0, 0, 1, False, 0, 0),  # below our commit index: acknowledged with it
        (1, 1, 1, False, 0, 0),  # matches a committed entry
        (2, 2, 2, False, 0, 0),  # matches an uncommitted entry
        (1, 2, 2, True, 1, 1),  # our entry 2 has another term: reject, hint at 1
        (3, 3, 3, True, 2, 2),  # we have no entry 3: reject, hint at our end
    ],
)
def test_5_3_follower_rejects_append_when_the_preceding_entry_does_not_match(
    log_term, index, want_index, reject, hint, hint_term
):
    """§5.3 consistency check: "If the follower does not find an entry in its log with the
    same index and term, then it refuses the new entries"."""
    c = Cluster(
        [1, 2, 3],
        logs={1: [Entry(1, 1), Entry(2, 2)]},
        hard_states={1: HardState(term=2, commit=1)},
    )
    c.node(1).step(Message(MessageType.MsgApp, to=1, frm=2, term=2, log_term=log_term, index=index))
    (resp,) = drain(c, 1)
    assert (resp.type, resp.to, resp.term) == (MessageType.MsgAppResp, 2, 2)
    assert (resp.index, resp.reject, resp.reject_hint, resp.log_term) == (
        want_index,
        reject,
        hint,
        hint_term,
    )


def test_5_3_follower_acknowledges_only_the_entries_the_message_proved_to_match():
    """§5.3: an AppendEntries proves the follower's log matches the leader's only up to the
    last entry it carried. A follower with a longer log (here 3/3 from a deposed term-3
    leader, while the leader has 4/3) must acknowledge index 2, not 3 — otherwise the leader
    would count it towards committing its own, different, entry 3."""
    c = Cluster(
        [1, 2, 3],
        logs={1: [Entry(1, 1), Entry(2, 2), Entry(3, 3)]},
        hard_states={1: HardState(term=3)},
    )
    c.node(1).step(
        Message(
            MessageType.MsgApp, to=1, frm=2, term=4, log_term=1, index=1, entries=(Entry(2, 2),)
        )
    )
    (resp,) = drain(c, 1)
    assert (resp.type, resp.reject, resp.index) == (MessageType.MsgAppResp, False, 2)
    assert c.log_terms(1) == [(1, 1), (2, 2), (3, 3)]  # nothing conflicted, nothing dropped


@pytest.mark.parametrize(
    "index, log_term, new, want_log",
    [
        (2, 2, [Entry(3, 3)], [(1, 1), (2, 2), (3, 3)]),
        (1, 1, [Entry(3, 2), Entry(4, 3)], [(1, 1), (2, 3), (3, 4)]),  # conflict: truncate
        (0, 0, [Entry(1, 1)], [(1, 1), (2, 2)]),  # already present: nothing lost
        (0, 0, [Entry(3, 1)], [(1, 3)]),  # conflict at the first entry
    ],
)
def test_5_3_follower_deletes_conflicting_entries_and_appends_new_ones(
    index, log_term, new, want_log
):
    """§5.3: "If an existing entry conflicts with a new one (same index but different
    terms), delete the existing entry and all that follow it"; entries already present are
    kept (a delayed AppendEntries must not truncate the log)."""
    c = Cluster([1, 2, 3], logs={1: [Entry(1, 1), Entry(2, 2)]}, hard_states={1: HardState(term=2)})
    c.node(1).step(
        Message(
            MessageType.MsgApp,
            to=1,
            frm=2,
            term=2,
            log_term=log_term,
            index=index,
            entries=tuple(new),
        )
    )
    drain(c, 1)
    assert c.log_terms(1) == want_log
    assert [
        (i, c.peers[1].storage.term(i)) for i in range(1, c.peers[1].storage.last_index() + 1)
    ] == want_log


FIGURE_7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE_7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7_FOLLOWERS))
def test_5_3_leader_brings_every_figure_7_follower_log_in_line_with_its_own(case):
    """§5.3 / Figure 7: missing entries (a, b), extra uncommitted entries (c, d) and
    conflicting entries from old terms (e, f) are all repaired: "the leader handles
    inconsistencies by forcing the followers' logs to duplicate its own"."""
    c = Cluster(
        [1, 2, 3],
        logs={1: log_of_terms(FIGURE_7_LEADER), 2: log_of_terms(FIGURE_7_FOLLOWERS[case])},
        hard_states={1: HardState(term=8, commit=len(FIGURE_7_LEADER)), 2: HardState(term=7)},
    )
    c.isolate(3)
    make_candidate(c, 1)
    # Follower (d)'s log is more up-to-date than the leader's: the vote comes from node 3.
    c.node(1).step(Message(MessageType.MsgVoteResp, to=1, frm=3, term=9))
    assert c.raft(1).state == StateType.LEADER
    c.propose(1, b"after")
    c.stabilize()
    assert c.log_terms(2) == c.log_terms(1)
    assert [e.data for e in c.log_entries(2)] == [e.data for e in c.log_entries(1)]


def test_5_3_log_matching_after_repair():
    """§5.3 Log Matching: "if two entries in different logs have the same index and term,
    then the logs are identical in all preceding entries" — checked across all Figure 7
    followers repaired by one leader in a 7-node cluster."""
    ids = list(range(1, 8))
    logs = {1: log_of_terms(FIGURE_7_LEADER)}
    for i, case in enumerate(sorted(FIGURE_7_FOLLOWERS), start=2):
        logs[i] = log_of_terms(FIGURE_7_FOLLOWERS[case])
    c = Cluster(ids, logs=logs, hard_states={i: HardState(term=8) for i in ids})
    make_candidate(c, 1)
    for v in (2, 3, 4, 6):  # a, b, c, e vote for the leader (their logs are not newer)
        c.node(1).step(Message(MessageType.MsgVoteResp, to=1, frm=v, term=9))
    assert c.raft(1).state == StateType.LEADER
    c.stabilize()
    assert_log_matching(c)
    assert all(c.log_terms(i) == c.log_terms(1) for i in ids)


# --- §5.4 safety -----------------------------------------------------------------------------


def test_5_4_1_candidate_sends_its_last_log_index_and_term():
    """§5.4.1: "The RequestVote RPC ... includes information about the candidate's log"."""
    c = Cluster([1, 2, 3], logs={1: log_of_terms([1, 1, 2])}, hard_states={1: HardState(term=2)})
    c.node(1).campaign()
    votes = of_type(drain(c, 1), MessageType.MsgVote)
    assert {(m.to, m.index, m.log_term, m.term) for m in votes} == {(2, 3, 2, 3), (3, 3, 2, 3)}


@pytest.mark.parametrize(
    "ours, log_term, index, reject",
    [
        ([1], 1, 1, False),  # same last term, same length
        ([1], 1, 2, False),  # same last term, candidate longer
        ([1, 1], 1, 1, True),  # same last term, candidate shorter
        ([1], 2, 1, False),  # candidate's last term higher
        ([1], 2, 2, False),
        ([1, 1], 2, 1, False),
        ([2], 1, 1, True),  # our last term higher
        ([2], 1, 2, True),
        ([2, 1], 1, 1, True),
    ],
)
def test_5_4_1_votes_only_for_candidates_with_an_up_to_date_log(ours, log_term, index, reject):
    """§5.4.1 election restriction: "the voter denies its vote if its own log is more
    up-to-date than that of the candidate" (compare last terms, then lengths)."""
    ents = [Entry(t, i + 1) for i, t in enumerate(ours)]
    c = Cluster([1, 2], logs={1: ents})
    c.node(1).step(
        Message(MessageType.MsgVote, to=1, frm=2, term=3, log_term=log_term, index=index)
    )
    (resp,) = drain(c, 1)
    assert (resp.type, resp.reject) == (MessageType.MsgVoteResp, reject)


@pytest.mark.parametrize("acked_index, want_commit", [(1, 0), (2, 0), (3, 3)])
def test_5_4_2_leader_commits_by_counting_only_entries_of_its_own_term(acked_index, want_commit):
    """§5.4.2: "Raft never commits log entries from previous terms by counting replicas.
    Only log entries from the leader's current term are committed by counting replicas"."""
    c = Cluster([1, 2], logs={1: [Entry(1, 1), Entry(2, 2)]}, hard_states={1: HardState(term=2)})
    make_leader_by_votes(c, 1)  # term 3; appends its empty entry at index 3
    drain(c, 1)  # persisted: the leader has acknowledged its own entries
    c.node(1).step(Message(MessageType.MsgAppResp, to=1, frm=2, term=3, index=acked_index))
    assert c.raft(1).log.committed == want_commit


def test_5_4_2_figure_8_an_old_term_entry_on_a_majority_can_still_be_overwritten():
    """§5.4.2 / Figure 8: (c) S1, leader in term 4, has its term-2 entry at index 2 on a
    majority (S1, S2, S3) — it must not count that as committed, because (d) S5 (with a
    term-3 entry at index 2) can still win an election with votes from S2, S3, S4 and
    overwrite index 2 everywhere. (e) Once an entry of S1's own term is on a majority, S5
    can no longer win."""
    ids = [1, 2, 3, 4, 5]
    logs = {
        1: [Entry(1, 1), Entry(2, 2)],
        2: [Entry(1, 1), Entry(2, 2)],
        3: [Entry(1, 1), Entry(2, 2)],
        4: [Entry(1, 1)],
        5: [Entry(1, 1), Entry(3, 2)],
    }
    hs = {i: HardState(term=3, commit=1) for i in ids}
    c = Cluster(ids, logs=logs, hard_states=hs)
    c.isolate(5)
    c.cut(1, 4)
    # (c) S1's own term-4 entry (index 3) does not get through; S2 and S3 acknowledge 2.
    c.msg_filter = lambda m: m.type == MessageType.MsgApp and any(e.index >= 3 for e in m.entries)
    c.elect(1)
    assert c.raft(1).term == 4
    for f in (2, 3):
        c.node(1).step(Message(MessageType.MsgAppResp, to=1, frm=f, term=4, index=2))
    c.stabilize()
    progress = c.node(1).status().progress
    assert [progress[i].match for i in (1, 2, 3)] == [3, 2, 2]  # index 2 is on a majority
    assert c.raft(1).log.committed == 1  # ...and still not committed
    # (d) S1 crashes; S5 wins (its last term 3 beats S2/S3/S4's) and overwrites index 2.
    c.heal()
    c.isolate(1)
    c.node(5).campaign()  # term 4 is S1's: S2/S3 already voted, so this round fails
    c.stabilize()
    c.elect(5)  # term 5, as in the paper's (d)
    for i in (2, 3, 4, 5):
        assert c.log_entries(i)[1].term == 3, i
    # (e) Replay with S1's term-4 entry reaching the majority: S5 cannot win any more.
    c2 = Cluster(ids, logs=logs, hard_states=hs)
    c2.isolate(5)
    c2.cut(1, 4)
    c2.elect(1)
    assert c2.raft(1).log.committed == 3
    c2.heal()
    c2.isolate(1)
    c2.node(5).campaign()
    c2.stabilize()
    assert c2.raft(5).state != StateType.LEADER
    assert c2.raft(2).log.term(2) == 2  # index 2 survives


def test_5_4_3_leader_completeness_a_node_missing_a_committed_entry_cannot_win():
    """§5.4.3 Leader Completeness: "if a log entry is committed in a given term, then that
    entry will be present in the logs of the leaders for all higher-numbered terms". Node 3
    missed a committed entry: it cannot collect a majority; node 2, which has it, can."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    c.propose(1, b"committed")
    c.stabilize()
    idx = c.raft(1).log.committed
    assert c.log_entries(1)[idx - 1].data == b"committed"
    c.heal()
    c.isolate(1)  # the leader fails
    c.node(3).campaign()
    c.stabilize()
    assert c.raft(3).state != StateType.LEADER
    c.elect(2)
    assert c.log_entries(2)[idx - 1].data == b"committed"
    c.stabilize()
    assert c.applied_data(3) == [b"committed"]  # the new leader repairs node 3


# --- Properties over random runs (§5.2 election safety, §5.3 log matching, §5.4 leader
# completeness and state machine safety) ----------------------------------------------------


def run_random_faults(seed: int, steps: int = 250, n: int = 5, **config):
    rng = random.Random(seed)
    ids = list(range(1, n + 1))
    c = Cluster(ids, seed=seed, **config)
    leaders_by_term: dict[int, int] = {}
    committed_log: dict[int, Entry] = {}  # index -> entry, as first seen committed anywhere
    # index -> a term no lower than the one the entry was committed in: the term of the node
    # that applied it first (commit knowledge never comes from a leader of a higher term)
    commit_term_bound: dict[int, int] = {}
    proposals = 0
    for step in range(steps):
        action = rng.random()
        if action < 0.05:
            c.heal()
            a, b = rng.sample(ids, 2)
            c.cut(a, b)
            if rng.random() < 0.5:
                c.isolate(rng.choice(ids))
        elif action < 0.08:
            c.heal()
        elif action < 0.10:
            victim = rng.choice(ids)
            c.queue = [m for m in c.queue if m.to != victim]
            c.restart(victim)
        elif action < 0.4:
            leader = c.leaders()
            target = rng.choice(leader or ids)
            try:
                c.propose(target, f"p{seed}-{step}".encode())
                proposals += 1
            except Exception:  # noqa: BLE001 - ProposalDroppedError without a leader
                pass
        for i in ids:
            c.tick(i)
        # deliver a random subset of what is queued; the rest stays for later (reordering)
        c.process_all_ready()
        rng.shuffle(c.queue)
        keep = len(c.queue) // 3
        later, now = c.queue[:keep], c.queue[keep:]
        c.queue = now
        c.deliver()
        c.queue.extend(later)
        c.process_all_ready()
        # --- checks ---
        for i in ids:
            r = c.raft(i)
            if r.state == StateType.LEADER:
                assert leaders_by_term.setdefault(r.term, i) == i, "two leaders in one term"
                # leader completeness: an entry committed in term T is in the log of every
                # leader of a term above T (a stale leader of an older term may lack it)
                for idx, e in committed_log.items():
                    if idx >= r.log.first_index() and r.term > commit_term_bound[idx]:
                        assert r.log.term(idx) == e.term, (seed, step, i, idx)
            for e in c.peers[i].applied:
                first = committed_log.setdefault(e.index, e)
                commit_term_bound.setdefault(e.index, c.raft(i).term)
                assert first == e, "state machine safety violated"
        if step % 25 == 0:
            assert_log_matching(c)
    c.heal()
    for _ in range(60):
        c.tick_all(1)
    assert_log_matching(c)
    return c, proposals


@pytest.mark.parametrize("seed", range(12))
def test_5_4_safety_properties_hold_under_random_partitions_restarts_and_reordering(seed):
    """§5.2 Election Safety, §5.3 Log Matching, §5.4.3 Leader Completeness and State Machine
    Safety, checked after every step of a random run; then liveness after healing."""
    c, proposals = run_random_faults(seed, pre_vote=(seed % 2 == 0), check_quorum=(seed % 3 == 0))
    assert proposals > 0
    leaders = c.leaders()
    assert len(leaders) == 1
    applied = {i: [e.index for e in c.peers[i].applied] for i in c.peers}
    longest = max(applied.values(), key=len)
    for seq in applied.values():
        assert seq == longest[: len(seq)]
