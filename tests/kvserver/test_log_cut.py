"""After a snapshot the node keeps the last ``snapshot_catchup_entries`` entries, and earlier
ones while all it keeps totals at most ``snapshot_catchup_bytes`` (kvserver.server.node).

A follower that was down for a while then catches up from the log instead of through a
snapshot of the whole store. A cut asks for a heap trim only when the entries it dropped
weigh enough to be worth the trim's hold on the allocator.
"""

from kvserver.server.node import Node, NodeOptions
from raft import Config, ConfState, Entry, MemoryStorage, RawNode, SnapshotMetadata


class _Storage:
    def __init__(self) -> None:
        self.raft_storage = MemoryStorage()

    def compact(self, index: int) -> None:
        self.raft_storage.compact(index)


def _node(
    entries: int, entry_bytes: int, keep_entries: int, keep_bytes: int, **options: int
) -> Node:
    storage = _Storage()
    storage.raft_storage.append(
        [Entry(term=1, index=i, data=b"x" * entry_bytes) for i in range(1, entries + 1)]
    )
    raw = RawNode(Config(id=1, storage=storage.raft_storage, election_tick=10, heartbeat_tick=1))
    return Node(
        raw=raw,
        node_id=1,
        storage=storage,  # type: ignore[arg-type]  # only raft_storage is read here
        options=NodeOptions(
            snapshot_catchup_entries=keep_entries, snapshot_catchup_bytes=keep_bytes, **options
        ),
        applied=0,
        conf_state=ConfState(voters=(1,)),
    )


def test_no_byte_budget_keeps_exactly_the_catchup_entries():
    node = _node(entries=1000, entry_bytes=100, keep_entries=50, keep_bytes=0)
    assert node._log_cut(900) == 850


def test_small_entries_are_kept_back_to_the_byte_budget():
    # 100 entries of 100 bytes fit in 10,000 bytes: the cut moves back from 850 by the
    # entries the budget still holds after [850, 900] (51 entries, 5,100 bytes) -> 49 more.
    node = _node(entries=1000, entry_bytes=100, keep_entries=50, keep_bytes=10_000)
    cut = node._log_cut(900)
    assert cut == 850 - 49
    kept = node.raw_storage.entries(cut, 901)
    assert sum(len(e.data) for e in kept) <= 10_000


def test_the_budget_never_cuts_below_the_first_entry_or_above_the_catchup_window():
    node = _node(entries=1000, entry_bytes=10, keep_entries=50, keep_bytes=10**9)
    assert node._log_cut(900) == node.raw_storage.first_index()
    big = _node(entries=1000, entry_bytes=10_000, keep_entries=50, keep_bytes=1)
    assert big._log_cut(900) == 850  # the catch-up entries are kept whatever they weigh


def _trims_after_snapshot(node: Node, index: int) -> list[str]:
    asked: list[str] = []
    node._on_memory_freed = asked.append
    metadata = SnapshotMetadata(conf_state=ConfState(voters=(1,)), index=index, term=1)
    node._keep_snapshot(metadata, b"state", "made by the test", "loop")
    return asked


def test_a_cut_of_small_entries_asks_for_no_trim():
    node = _node(entries=1000, entry_bytes=100, keep_entries=50, keep_bytes=0)
    assert _trims_after_snapshot(node, 900) == []
    assert node.raw_storage.first_index() == 851  # the log was cut all the same


def test_a_cut_that_frees_enough_asks_for_a_trim():
    # 36 entries of 1 MiB cut (the default minimum is 32 MiB)
    node = _node(entries=40, entry_bytes=1 << 20, keep_entries=2, keep_bytes=0)
    assert _trims_after_snapshot(node, 39) == ["log-cut"]
    # the minimum is the node's option: 849 entries of 100 bytes reach 80,000
    small = _node(
        entries=1000, entry_bytes=100, keep_entries=50, keep_bytes=0, log_cut_trim_min_bytes=80_000
    )
    assert _trims_after_snapshot(small, 900) == ["log-cut"]
