"""KeyIndex answers as a dict with sorted keys would, and no dict in it holds many keys it did
not start with (so none rehashes the whole index when it grows).

The model is a plain dict; order is checked against ``sorted`` of its keys.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc.keyindex import SHARDS, KeyIndex

KEYS = st.binary(min_size=0, max_size=3)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(0, 9)),
        st.tuples(st.just("del"), KEYS, st.just(0)),
        st.tuples(
            st.just("update"), st.dictionaries(KEYS, st.integers(0, 9), max_size=6), st.just(0)
        ),
    ),
    max_size=60,
)


def check_equal(index: KeyIndex, model: dict) -> None:
    assert len(index) == len(model)
    assert list(index) == sorted(model)
    assert sorted(index.values()) == sorted(model.values())
    for k, v in model.items():
        assert k in index and index[k] == v and index.get(k) == v
    assert index.values_of(sorted(model)) == [model[k] for k in sorted(model)]


@settings(max_examples=300)
@given(base=st.dictionaries(KEYS, st.integers(0, 9), max_size=8), ops=OPS, probe=KEYS)
def test_index_matches_a_dict_model(base: dict, ops: list, probe: bytes) -> None:
    model = {k: [v] for k, v in base.items()}
    index = KeyIndex(dict(model))
    for op, arg, value in ops:
        if op == "set":
            index[arg] = [value]
            model[arg] = [value]
        elif op == "del":
            if arg in model:
                del index[arg]
                del model[arg]
            else:
                try:
                    del index[arg]
                except KeyError:
                    pass
                else:
                    raise AssertionError("deleting an absent key succeeded")
        else:
            new = {k: [v] for k, v in arg.items()}
            index.update(new)
            model.update(new)
        check_equal(index, model)
    assert (probe in index) == (probe in model)
    assert index.get(probe) == model.get(probe)
    lo, hi = b"\x40", b"\x80"
    assert list(index.irange(lo, hi, (True, False))) == sorted(k for k in model if lo <= k < hi)
    assert list(index.irange(probe)) == sorted(k for k in model if k >= probe)


def test_an_absent_key_raises_key_error() -> None:
    index = KeyIndex({b"a": [1]})
    index[b"b"] = [2]
    for missing in (b"c", b""):
        try:
            index[missing]
        except KeyError:
            continue
        raise AssertionError(f"{missing!r} found")


def test_keys_added_after_a_bulk_build_spread_over_the_shards() -> None:
    """The base never gets a key it did not start with, and new keys spread so that no
    shard holds more than a few times its share: a shard's growth rehashes only it."""
    index = KeyIndex({b"base/%06d" % i: [i] for i in range(10_000)})
    n = 100 * SHARDS
    for i in range(n):
        index[b"new/%08d" % i] = [i]
    del index[b"base/000000"]
    index[b"base/000000"] = [0]  # deleted from the base, put again: into a shard
    assert len(index._base) == 9_999
    assert index._sharded == n + 1 == sum(map(len, index._shards))
    assert max(map(len, index._shards)) < 3 * n // SHARDS
    assert len(index) == 10_000 + n


def test_a_bulk_update_folds_the_shards_into_the_base_and_a_small_one_does_not() -> None:
    index = KeyIndex({b"k%03d" % i: [i] for i in range(100)})
    index[b"new"] = [0]  # into a shard
    index.update({b"k%03d" % i: [i] for i in range(100, 105)})  # 5 < 101 / 10: key by key
    assert index._sharded == 6 and len(index._base) == 100
    bulk = {b"b%03d" % i: [i] for i in range(20)}
    bulk[b"new"] = [1]
    index.update(bulk)  # 21 >= 106 / 10: one fold into the base
    assert index._sharded == 0 and not any(index._shards)
    assert len(index._base) == len(index) == 126
    assert index[b"new"] == [1] and list(index) == sorted(index._base)
