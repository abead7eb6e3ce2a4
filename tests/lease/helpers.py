"""Shared helpers of the lease tests: a fake monotonic clock and a lessor bound to a store."""

from kvserver.lease.lessor import LeaseIdGenerator, Lessor
from kvserver.mvcc import MVCCStore


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
