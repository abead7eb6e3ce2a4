"""Shared helpers of the lease tests: a fake monotonic clock, a lessor bound to a store, and,
for in-process members, the leader once its lessor is primary."""

from kvserver.assembly.member import Member
from kvserver.lease.lessor import LeaseIdGenerator, Lessor
from kvserver.mvcc import MVCCStore
from kvserver.server.replicated_kv import RaftKV
from tests.support.inprocess import agreed_leader
from tests.support.wait import async_wait_for


class FakeClock:
    """A monotonic clock that moves only when told to (tests never sleep)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def make(primary: bool = True, **options) -> tuple[Lessor, MVCCStore, FakeClock]:
    clock = options.pop("clock", None) or FakeClock()
    store = MVCCStore()
    lessor = Lessor(store=store, clock=clock, **options)
    if primary:
        lessor.promote(0.0)
    return lessor, store, clock


def ids(member_id: int = 1) -> LeaseIdGenerator:
    return LeaseIdGenerator(member_id, now_ms=1_700_000_000_000)


def kv(member: Member) -> RaftKV:
    """A member's replicated KV state machine."""
    return member.node.sm


def _promoted_leader(members: list[Member]) -> Member | None:
    leader = agreed_leader(members)
    return leader if leader is not None and kv(leader).lessor.is_primary else None


async def wait_promoted(members: list[Member], timeout_s: float = 15.0) -> Member:
    """The agreed leader, once its lessor is primary (its first entry of the term applied)."""
    return await async_wait_for(
        lambda: _promoted_leader(members), timeout_s, "a leader whose lessor is primary"
    )
