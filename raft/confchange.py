"""Membership changes applied to a ProgressTracker: one node at a time, no joint consensus.

A single change alters the voter set by at most one node, so any majority of the old
configuration intersects any majority of the new one (Raft thesis §4.1); together with the
leader's one-pending-change rule this keeps elections safe without joint consensus.

Rules (as etcd's simple changes):

* ADD_NODE n: n becomes a voter (a learner n is promoted, keeping its progress).
* ADD_LEARNER_NODE n: n becomes a learner (a voter n is demoted).
* REMOVE_NODE n: n leaves the configuration.
* UPDATE_NODE, and any change of node 0: no effect on the configuration.

A change that would leave no voters is refused with ConfChangeError and changes nothing.
"""

from __future__ import annotations

from raft.errors import ConfChangeError
from raft.tracker import ProgressTracker
from raft.types import ConfChange, ConfChangeType, ConfState


def _new_progress(tracker: ProgressTracker, node_id: int, last_index: int, learner: bool) -> None:
    # Start probing at the leader's last index; RecentActive so that a freshly added node
    # is not counted as dead by the next check-quorum round before it had a chance to reply.
    pr = tracker.new_progress(0, max(last_index, 1), learner)
    pr.recent_active = True
    tracker.progress[node_id] = pr


def apply_change(tracker: ProgressTracker, cc: ConfChange, last_index: int) -> None:
    """Apply ``cc`` to ``tracker`` in place (all-or-nothing)."""
    n = cc.node_id
    if n == 0 or cc.type == ConfChangeType.UPDATE_NODE:
        return
    if cc.type == ConfChangeType.ADD_NODE:
        if n in tracker.voters:
            return
        tracker.voters.add(n)
        if n in tracker.learners:
            tracker.learners.discard(n)
            tracker.progress[n].is_learner = False
        else:
            _new_progress(tracker, n, last_index, learner=False)
    elif cc.type == ConfChangeType.ADD_LEARNER_NODE:
        if n in tracker.learners:
            return
        if n in tracker.voters:
            if len(tracker.voters) == 1:
                raise ConfChangeError(f"demoting {n} would leave no voters")
            tracker.voters.discard(n)
            tracker.learners.add(n)
            tracker.progress[n].is_learner = True
        else:
            tracker.learners.add(n)
            _new_progress(tracker, n, last_index, learner=True)
    elif cc.type == ConfChangeType.REMOVE_NODE:
        if n in tracker.voters:
            if len(tracker.voters) == 1:
                raise ConfChangeError(f"removing {n} would leave no voters")
            tracker.voters.discard(n)
        elif n in tracker.learners:
            tracker.learners.discard(n)
        else:
            return
        del tracker.progress[n]
    else:  # pragma: no cover - enum is exhaustive
        raise ConfChangeError(f"unknown conf change type {cc.type}")


def restore(tracker: ProgressTracker, cs: ConfState, last_index: int) -> None:
    """Reset ``tracker`` to the configuration ``cs`` (from storage or a snapshot)."""
    if cs.voters_outgoing or cs.learners_next or cs.auto_leave:
        raise ConfChangeError(f"joint configurations are not supported: {cs}")
    if set(cs.voters) & set(cs.learners):
        raise ConfChangeError(f"a node is both voter and learner: {cs}")
    tracker.voters = set()
    tracker.learners = set()
    tracker.progress = {}
    for v in cs.voters:
        tracker.voters.add(v)
        _new_progress(tracker, v, last_index, learner=False)
    for v in cs.learners:
        tracker.learners.add(v)
        _new_progress(tracker, v, last_index, learner=True)
