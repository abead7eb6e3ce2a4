"""The simulation's checkers must be able to fail: feed them broken histories and logs.

Each test builds the smallest report sequence that breaks one property and expects the
checker to raise; a matching control sequence that is fine must pass, so a checker that
raises on everything would fail here too.
"""

import pytest

from raft import Entry, EntryType
from tests.sim.checkers import SafetyChecker, SafetyViolation
from tests.sim.history import History, LinearizabilityViolation
from tests.sim.kv import KVStore, encode_put


def e(term, index, data=b""):
    return Entry(term=term, index=index, type=EntryType.NORMAL, data=data)


# -- election safety (Raft §5.2, figure 3 "Election Safety") -----------------------------


def test_two_leaders_in_one_term_fail():
    c = SafetyChecker()
    c.leader(1, 3)
    c.leader(1, 3)  # the same leader reported twice is fine
    c.leader(2, 4)  # another leader in another term is fine
    with pytest.raises(SafetyViolation, match="election safety"):
        c.leader(3, 3)


def test_vote_changed_within_term_fails():
    SafetyChecker.hard_state(1, old_term=2, old_vote=0, term=2, vote=3)  # first vote: fine
    SafetyChecker.hard_state(1, old_term=2, old_vote=3, term=3, vote=0)  # new term: fine
    with pytest.raises(SafetyViolation, match="vote changed"):
        SafetyChecker.hard_state(1, old_term=2, old_vote=3, term=2, vote=2)
    with pytest.raises(SafetyViolation, match="term went down"):
        SafetyChecker.hard_state(1, old_term=5, old_vote=1, term=4, vote=1)


# -- log matching (Raft §5.3) ------------------------------------------------------------


def test_same_index_and_term_with_different_data_fails():
    c = SafetyChecker()
    c.append(1, 0, [e(1, 1, b"x"), e(1, 2, b"y")], commit=0)
    c.append(2, 0, [e(1, 1, b"x")], commit=0)  # a prefix of the same log: fine
    with pytest.raises(SafetyViolation, match="log matching"):
        c.append(3, 1, [e(1, 2, b"z")], commit=0)


def test_same_index_and_term_with_different_predecessor_fails():
    c = SafetyChecker()
    c.append(1, 1, [e(2, 5, b"x")], commit=0)
    with pytest.raises(SafetyViolation, match="log matching"):
        c.append(2, 2, [e(2, 5, b"x")], commit=0)


def test_non_contiguous_or_term_decreasing_append_fails():
    c = SafetyChecker()
    with pytest.raises(SafetyViolation, match="not contiguous"):
        c.append(1, 0, [e(1, 1), e(1, 3)], commit=0)
    with pytest.raises(SafetyViolation, match="term goes down"):
        c.append(1, 0, [e(2, 1), e(1, 2)], commit=0)


# -- committed entries are permanent (Raft §5.4) ----------------------------------------


def test_changed_committed_entry_fails():
    c = SafetyChecker()
    c.commit(1, e(1, 1, b"a"))
    c.commit(2, e(1, 1, b"a"))
    with pytest.raises(SafetyViolation, match="committed entry changed"):
        c.commit(3, e(2, 1, b"b"))


def test_overwriting_own_committed_entry_fails():
    c = SafetyChecker()
    c.append(1, 0, [e(1, 1, b"a"), e(1, 2, b"b")], commit=0)
    c.commit(1, e(1, 1, b"a"))
    c.append(1, 1, [e(2, 2, b"c")], commit=1)  # index 2 was not committed: fine
    with pytest.raises(SafetyViolation, match="overwrote its committed"):
        c.append(1, 0, [e(3, 1, b"d")], commit=1)


def test_leader_without_committed_entry_fails():
    c = SafetyChecker()
    c.commit(1, e(1, 1, b"a"))
    c.commit(1, e(2, 2, b"b"))
    good = {1: 1, 2: 2, 3: 3}
    c.leader_log(2, lambda i: good.get(i, -1))
    c.leader_log(2, lambda i: None if i <= 2 else 3)  # compacted into a snapshot: fine
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.leader_log(3, lambda i: {1: 1}.get(i, -1))  # index 2 missing
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.leader_log(3, lambda i: {1: 1, 2: 3}[i])  # index 2 has another term


# -- state machine safety (Raft §5.4.3) ---------------------------------------------------


def _apply_all(c, node, entries, commit):
    kv = KVStore()
    for ent in entries:
        before = kv.applied
        kv.apply(ent.index, ent.term, ent.type, ent.data)
        c.apply(node, before, commit, ent, kv.chain)
    return kv


def test_divergent_applied_sequences_fail():
    c = SafetyChecker()
    log = [e(1, 1, encode_put(1, "k")), e(1, 2, encode_put(2, "k"))]
    _apply_all(c, 1, log, commit=2)
    _apply_all(c, 2, log, commit=2)  # the same sequence: fine
    with pytest.raises(SafetyViolation, match="committed entry changed"):
        _apply_all(c, 3, [log[0], e(1, 2, encode_put(3, "k"))], commit=2)


def test_divergent_chain_at_same_index_fails():
    """A node restored from a snapshot whose state is not the sequence others applied."""
    c = SafetyChecker()
    kv = _apply_all(c, 1, [e(1, 1, encode_put(1, "k")), e(1, 2, encode_put(2, "k"))], 2)
    c.apply_snapshot(2, 0, 2, 1, kv.chain)  # the same state via a snapshot: fine
    with pytest.raises(SafetyViolation, match="state machine safety"):
        c.apply_snapshot(3, 0, 2, 1, kv.chain ^ 1)


def test_gap_or_uncommitted_apply_fails():
    c = SafetyChecker()
    with pytest.raises(SafetyViolation, match="not contiguous"):
        c.apply(1, 0, 5, e(1, 2), 0)
    with pytest.raises(SafetyViolation, match="beyond its commit"):
        c.apply(1, 0, 0, e(1, 1), 0)


def test_snapshot_behind_applied_or_wrong_term_fails():
    c = SafetyChecker()
    c.commit(1, e(2, 4))
    with pytest.raises(SafetyViolation, match="below applied"):
        c.apply_snapshot(1, 5, 4, 2, 0)
    with pytest.raises(SafetyViolation, match="is committed"):
        c.apply_snapshot(1, 0, 4, 3, 0)


# -- linearizable reads -------------------------------------------------------------------


def _history_with_write(op=1, key="k", rev=5):
    """Write op invoked at 0, applied at 1, acknowledged at 2."""
    h = History()
    h.invoke_write(op, key)
    h.advance_to(1)
    h.write_applied(op, rev)
    h.advance_to(2)
    h.write_done(op)
    return h


def test_read_that_sees_the_acknowledged_write_passes():
    h = _history_with_write()
    h.advance_to(3)
    h.invoke_read(1, "k")
    h.advance_to(4)
    h.read_done(1, 1, 5)


def test_concurrent_read_may_see_old_or_new_value():
    h = History()
    h.invoke_write(1, "k")
    h.invoke_read(1, "k")
    h.invoke_read(2, "k")
    h.advance_to(1)
    h.write_applied(1, 3)
    h.read_done(1, None, 0)  # concurrent with the write: the initial value is fine
    h.read_done(2, 1, 3)


def test_stale_read_missing_an_applied_write_fails():
    h = _history_with_write()
    h.advance_to(3)
    h.invoke_read(1, "k")
    h.advance_to(4)
    with pytest.raises(LinearizabilityViolation, match="initial value"):
        h.read_done(1, None, 0)


def test_stale_read_of_overwritten_value_fails():
    h = _history_with_write(op=1, rev=5)
    h.advance_to(3)
    h.invoke_write(2, "k")
    h.advance_to(4)
    h.write_applied(2, 7)
    h.advance_to(5)
    h.write_done(2)
    h.advance_to(6)
    h.invoke_read(1, "k")
    h.advance_to(7)
    with pytest.raises(LinearizabilityViolation, match="stale read|overwritten"):
        h.read_done(1, 1, 5)


def test_real_time_rule_alone_catches_overwritten_value():
    """Rule 3 (client-visible times only) fires even when revisions look plausible."""
    h = History()
    h.invoke_write(1, "k")
    h.advance_to(1)
    h.write_applied(1, 5)
    h.write_done(1)
    h.advance_to(2)
    h.invoke_write(2, "k")
    h.advance_to(3)
    h.write_applied(2, 7)
    h.write_done(2)
    h.advance_to(4)
    h.invoke_read(1, "k")
    h.reads[1].min_rev = 0  # blind rule 2, leave rule 3 alone
    h.advance_to(5)
    with pytest.raises(LinearizabilityViolation, match="overwritten"):
        h.read_done(1, 1, 5)


def test_read_from_the_future_fails():
    h = History()
    h.invoke_read(1, "k")
    h.advance_to(1)
    with pytest.raises(LinearizabilityViolation, match="never invoked"):
        h.read_done(1, 9, 4)


def test_reads_going_back_in_time_fail():
    h = History()
    h.invoke_write(1, "k")
    h.invoke_write(2, "k")
    h.advance_to(1)
    h.write_applied(1, 3)
    h.write_applied(2, 4)
    h.invoke_read(1, "k")
    h.advance_to(2)
    h.read_done(1, 2, 4)
    h.advance_to(3)
    h.invoke_read(2, "k")
    h.reads[2].min_rev = 0  # blind rule 2 (applied writes), test rule 4 alone
    h.advance_to(4)
    with pytest.raises(LinearizabilityViolation, match="earlier completed read"):
        h.read_done(2, 1, 3)


def test_failed_reads_constrain_nothing():
    h = _history_with_write()
    h.advance_to(3)
    h.invoke_read(1, "k")
    h.read_failed(1)
    assert h.completed_reads == 0


def test_write_at_two_revisions_fails():
    h = History()
    h.invoke_write(1, "k")
    h.write_applied(1, 3)
    with pytest.raises(LinearizabilityViolation, match="revision"):
        h.write_applied(1, 4)
