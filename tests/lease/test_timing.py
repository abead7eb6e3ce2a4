"""The lessor's leader-only half: deadlines on an injected clock (a fake one here).

Pins etcd's lessor behaviour (server/lease/lessor.go): Renew refreshes to the granted TTL and
refuses expired leases; only the primary expires leases, by listing them for a revoke through
raft, re-listing after the retry interval; Promote gives every lease a fresh full (or
checkpointed) TTL plus an extension and spreads pile-ups; Demote stops expiry;
LeaseTimeToLive / LeaseLeases answers; checkpoint scheduling.
"""

import pytest

from kvserver.kvpb.errors import GrpcCode
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest
from kvserver.lease.codec import LeaseCheckpointRequest
from kvserver.lease.errors import LeaseExpiredError, NotPrimaryError
from kvserver.mvcc import LeaseNotFoundError, PutRequest

from .helpers import make


def test_keepalive_refreshes_to_the_granted_ttl():
    lessor, _, clock = make()
    lessor.apply(LeaseGrantRequest(10, 1))
    clock.advance(9.5)
    assert lessor.expired() == []
    assert lessor.keepalive(1) == 10
    clock.advance(9.9)
    assert lessor.expired() == [] and lessor.remaining_s(1) == pytest.approx(0.1)
    clock.advance(0.1)
    assert lessor.expired() == [1]


def test_expired_lease_is_listed_once_per_retry_interval_until_revoked():
    """etcd expireExists: an expired lease is handed out, then re-checked only after
    expiredLeaseRetryInterval (the revoke may have been lost)."""
    lessor, _, clock = make(expired_retry_interval_s=3.0)
    lessor.apply(LeaseGrantRequest(5, 1))
    clock.advance(5)
    assert lessor.expired() == [1]
    assert lessor.expired() == []
    clock.advance(2.9)
    assert lessor.expired() == []
    clock.advance(0.1)
    assert lessor.expired() == [1]
    lessor.apply(LeaseRevokeRequest(1))
    clock.advance(10)
    assert lessor.expired() == []


def test_expired_respects_the_limit_and_returns_soonest_first():
    lessor, _, clock = make()
    for lid, ttl in ((1, 30), (2, 10), (3, 20), (4, 40)):
        lessor.apply(LeaseGrantRequest(ttl, lid))
    clock.advance(100)
    assert lessor.expired(limit=2) == [2, 3]
    assert lessor.expired(limit=5) == [1, 4]


def test_keepalive_of_an_expired_lease_is_refused():
    """etcd Renew: an expired lease may already be being revoked; refreshing it would let a
    client keep a lease that is about to vanish. LeaseExpiredError is a LeaseNotFoundError."""
    lessor, _, clock = make()
    lessor.apply(LeaseGrantRequest(5, 1))
    clock.advance(5)
    with pytest.raises(LeaseExpiredError) as exc:
        lessor.keepalive(1)
    assert isinstance(exc.value, LeaseNotFoundError)
    assert str(exc.value) == "etcdserver: requested lease not found"
    assert lessor.is_expired(1)
    with pytest.raises(LeaseNotFoundError):
        lessor.keepalive(2)


def test_only_the_primary_keeps_alive_answers_ttl_or_expires():
    """etcd: Renew on a non-primary is ErrNotPrimary (the server forwards to the leader)."""
    lessor, _, clock = make(primary=False)
    lessor.apply(LeaseGrantRequest(5, 1))
    clock.advance(1000)
    assert lessor.expired() == [] and lessor.due_checkpoints() == []
    assert lessor.next_deadline() is None
    with pytest.raises(NotPrimaryError) as exc:
        lessor.keepalive(1)
    assert str(exc.value) == "etcdserver: not leader"
    assert exc.value.grpc_code == GrpcCode.FAILED_PRECONDITION
    with pytest.raises(NotPrimaryError):
        lessor.time_to_live(1)
    assert lessor.leases().leases == (1,)  # any member lists leases


def test_promote_after_leader_change_never_expires_a_lease_early():
    """etcd Promote: the new leader gives every lease now + TTL + extend, so a lease
    kept alive on the old leader survives the election."""
    old, _, old_clock = make(primary=True)
    new, _, new_clock = make(primary=False)
    for lessor in (old, new):
        lessor.apply(LeaseGrantRequest(10, 1))
    old_clock.advance(8)
    old.keepalive(1)  # the client refreshes at t=8 on the old leader, which then dies
    new_clock.advance(9)  # election over at t=9 on the new leader's clock
    new.promote(extend_s=1.0)
    assert new.remaining_s(1) == pytest.approx(11.0)
    new_clock.advance(10.9)
    assert new.expired() == []
    new_clock.advance(0.1)
    assert new.expired() == [1]


def test_promote_uses_the_checkpointed_remaining_ttl():
    """etcd refresh(extend): remainingTTL when checkpointed, else the granted TTL."""
    lessor, _, clock = make(primary=False)
    lessor.apply(LeaseGrantRequest(600, 1))
    lessor.apply(LeaseGrantRequest(600, 2))
    lessor.apply(LeaseCheckpointRequest(((1, 100),)))
    lessor.promote(extend_s=2.0)
    assert lessor.remaining_s(1) == pytest.approx(102.0)
    assert lessor.remaining_s(2) == pytest.approx(602.0)


def test_demote_stops_expiry_and_a_later_promote_starts_over():
    lessor, _, clock = make()
    lessor.apply(LeaseGrantRequest(5, 1))
    clock.advance(4)
    lessor.demote()
    assert not lessor.is_primary
    clock.advance(100)
    assert lessor.expired() == [] and lessor.lookup(1).expiry == float("inf")
    lessor.promote(1.0)
    assert lessor.expired() == []
    clock.advance(6)
    assert lessor.expired() == [1]


def test_grant_applied_on_a_follower_gets_a_deadline_only_on_promote():
    lessor, _, clock = make(primary=False)
    lessor.apply(LeaseGrantRequest(5, 1))
    assert lessor.lookup(1).expiry == float("inf")
    clock.advance(50)
    lessor.promote(0.0)
    assert lessor.remaining_s(1) == pytest.approx(5.0)


def test_time_to_live_answers_remaining_granted_and_sorted_keys():
    """etcd LeaseTimeToLive: TTL = remaining seconds truncated; grantedTTL; keys if asked;
    an unknown lease answers TTL -1 (what etcd's gRPC layer makes of not-found)."""
    lessor, store, clock = make()
    lessor.apply(LeaseGrantRequest(30, 1))
    for key in (b"b", b"a"):
        store.apply(PutRequest(key, b"v", lease=1))
    clock.advance(10.7)
    r = lessor.time_to_live(1)
    assert (r.lease_id, r.ttl_s, r.granted_ttl_s, r.keys) == (1, 19, 30, ())
    assert r.header.revision == store.revision
    assert lessor.time_to_live(1, keys=True).keys == (b"a", b"b")
    missing = lessor.time_to_live(77, keys=True)
    assert (missing.lease_id, missing.ttl_s, missing.granted_ttl_s, missing.keys) == (77, -1, 0, ())


def test_leases_are_listed_by_deadline_then_id():
    lessor, _, clock = make()
    for lid, ttl in ((5, 30), (9, 10), (1, 20), (2, 20)):
        lessor.apply(LeaseGrantRequest(ttl, lid))
    assert lessor.leases().leases == (9, 1, 2, 5)
    clock.advance(5)
    lessor.keepalive(1)
    assert lessor.leases().leases == (9, 2, 1, 5)
    lessor.demote()
    assert lessor.leases().leases == (1, 2, 5, 9)


def test_checkpoints_are_offered_after_the_interval_and_cleared_by_keepalive():
    """etcd checkpointing: a lease longer than the interval gets its remaining TTL
    checkpointed every interval; a renew of a checkpointed lease queues a clear (0)."""
    lessor, _, clock = make(checkpoint_interval_s=300.0)
    lessor.apply(LeaseGrantRequest(1000, 1))
    lessor.apply(LeaseGrantRequest(100, 2))  # shorter than the interval: never checkpointed
    assert lessor.due_checkpoints() == []
    clock.advance(299.5)
    assert lessor.due_checkpoints() == []
    clock.advance(0.6)
    due = lessor.due_checkpoints()
    assert due == [(1, 700)]  # ceil(1000 - 300.1)
    lessor.apply(LeaseCheckpointRequest(tuple(due)))  # applying schedules the next one
    clock.advance(300)
    assert lessor.due_checkpoints() == [(1, 400)]
    lessor.apply(LeaseCheckpointRequest(((1, 400),)))
    assert lessor.keepalive(1) == 1000
    assert lessor.remaining_s(1) == pytest.approx(1000.0)  # the full TTL, not the checkpoint
    assert lessor.next_deadline() <= clock.now  # a clear is waiting
    assert lessor.due_checkpoints() == [(1, 0)]
    lessor.apply(LeaseCheckpointRequest(((1, 0),)))
    assert lessor.lookup(1).remaining_ttl_s == 0
    assert lessor.due_checkpoints() == []


def test_checkpoints_disabled_by_default():
    lessor, _, clock = make()
    lessor.apply(LeaseGrantRequest(10_000, 1))
    clock.advance(5000)
    assert lessor.due_checkpoints() == []


def test_next_deadline_points_at_the_soonest_expiry():
    lessor, _, clock = make()
    assert lessor.next_deadline() is None
    lessor.apply(LeaseGrantRequest(10, 1))
    lessor.apply(LeaseGrantRequest(5, 2))
    assert lessor.next_deadline() == clock.now + 5
    lessor.apply(LeaseRevokeRequest(2))
    assert lessor.next_deadline() == clock.now + 10


def test_promote_spreads_a_pile_up_of_expiries_and_never_shortens_a_lease():
    """etcd Promote: with at least revoke-rate leases, expiries are spread so that about 3/4
    of the revoke rate fall in a one-second window; here 2000 leases that would all expire at
    the same instant, with a rate of 100/s."""
    lessor, _, clock = make(primary=False, revoke_rate_per_s=100)
    n = 2000
    for lid in range(1, n + 1):
        lessor.apply(LeaseGrantRequest(10, lid))
    lessor.promote(extend_s=1.0)
    base = clock.now + 11.0
    times = sorted(lessor.lookup(lid).expiry for lid in range(1, n + 1))
    assert times[0] == pytest.approx(base)
    assert all(t >= base - 1e-9 for t in times)
    target = 75
    # any one-second sliding window holds at most two windows' worth
    for i in range(n - 2 * target):
        assert times[i + 2 * target] >= times[i] + 1.0 - 1e-9
    # the spread is as short as the rate allows: ceil(2000 / 75) windows
    assert times[-1] - base == pytest.approx(26.0)
    # and expired() hands them out in deadline order, bounded per call
    clock.advance(11.0)
    assert len(lessor.expired(limit=1000)) == target


def test_no_spreading_below_the_revoke_rate():
    lessor, _, clock = make(primary=False, revoke_rate_per_s=100)
    for lid in range(1, 100):
        lessor.apply(LeaseGrantRequest(10, lid))
    lessor.promote(extend_s=0.0)
    assert {lessor.lookup(lid).expiry for lid in range(1, 100)} == {clock.now + 10}


def test_many_keepalives_do_not_grow_the_expiry_heap():
    """Every refresh leaves a stale heap entry; the heap is rebuilt before they dominate."""
    lessor, _, clock = make()
    for lid in range(1, 11):
        lessor.apply(LeaseGrantRequest(10, lid))
    for _ in range(10_000):
        clock.advance(0.001)
        lessor.keepalive(3)
    assert len(lessor._expiry_heap) <= 2 * len(lessor) + 65
    clock.advance(9.9)
    assert sorted(lessor.expired()) == [lid for lid in range(1, 11) if lid != 3]


def test_frequent_keepalives_do_not_multiply_checkpoints():
    """One checkpoint offer per interval per lease, however often the lease is refreshed; a
    lease refreshed at checkpoint time is looked at again one interval later (a driver that
    proposes whatever due_checkpoints offers, once a second, for 20 minutes; the client
    refreshes for the first 7 minutes only)."""
    lessor, _, clock = make(checkpoint_interval_s=300.0)
    lessor.apply(LeaseGrantRequest(2000, 1))
    start = clock.now
    proposed = []
    for second in range(1, 1201):
        clock.advance(1.0)
        if second <= 420:
            lessor.keepalive(1)
        due = lessor.due_checkpoints()
        if due:
            proposed += [(round(clock.now - start), lid, rem) for lid, rem in due]
            lessor.apply(LeaseCheckpointRequest(tuple(due)))
    # refreshed at t=300: nothing to record; t=600 and t=900 and t=1200 record the remaining
    # TTL of a lease last refreshed at t=420 (expiring at t=2420)
    assert proposed == [(600, 1, 1820), (900, 1, 1520), (1200, 1, 1220)]
    assert len(lessor._checkpoint_heap) <= 2 * len(lessor) + 65
