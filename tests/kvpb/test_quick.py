"""Quick constructors: indistinguishable from the frozen dataclass's own constructor."""

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvserver.kvpb import kv, lease
from kvserver.kvpb.quick import quick_constructor, replace_field

FROZEN_CLASSES = [
    c
    for c in vars(kv).values()
    if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen
]


def test_the_messages_hot_paths_build_get_a_quick_constructor():
    for cls in (kv.KeyValue, kv.Event, kv.PutRequest, kv.RequestOp):
        assert quick_constructor(cls) is not cls, cls.__name__


def test_any_frozen_message_built_quickly_equals_its_default():
    """Whatever the message (a class it cannot mirror comes back as itself), the quick
    constructor's instance of its defaults is the class's own."""
    assert len(FROZEN_CLASSES) > 10
    for cls in FROZEN_CLASSES:
        required = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        args = [b"k" if f.type in ("bytes", bytes) else 0 for f in required]
        built = quick_constructor(cls)(*args)
        assert type(built) is cls and built == cls(*args), cls.__name__


@given(
    st.binary(max_size=8),
    st.binary(max_size=8),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.integers(0, 2**31),
    st.integers(-(2**63), 2**63),
)
def test_a_quick_key_value_is_a_key_value(key, value, create, mod, version, lease):
    quick = quick_constructor(kv.KeyValue)(key, value, create, mod, version, lease)
    plain = kv.KeyValue(key, value, create, mod, version, lease)
    assert type(quick) is kv.KeyValue
    assert quick == plain and hash(quick) == hash(plain) and repr(quick) == repr(plain)
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert pickle.loads(pickle.dumps(quick)) == plain
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.value = b"changed"  # type: ignore[misc]


def test_defaults_and_nested_messages():
    put = quick_constructor(kv.PutRequest)(b"k")
    assert put == kv.PutRequest(b"k")
    op = quick_constructor(kv.RequestOp)(None, put, None, None)
    assert op == kv.RequestOp(request_put=kv.PutRequest(b"k")) and op.request_put is put
    event = quick_constructor(kv.Event)(kv.EventType.DELETE, kv.KeyValue(b"k"))
    assert event == kv.Event(kv.EventType.DELETE, kv.KeyValue(b"k"), None)


def test_classes_it_cannot_mirror_are_returned_as_they_are():
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self):
            if self.a < 0:
                raise ValueError("negative")

    for cls in (Mutable, NoSlots, Checked, int):
        assert quick_constructor(cls) is cls


RESPONSES = [  # every answer a member stamps with its header (KV and lease)
    c
    for module in (kv, lease)
    for c in vars(module).values()
    if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__name__.endswith("Response")
]


@given(st.integers(0, 2**63), st.integers(0, 2**63), st.integers(0, 2**63))
def test_replacing_a_field_is_dataclasses_replace(cluster, revision, term):
    """Every response's header replaced quickly equals ``dataclasses.replace``'s, for any
    field's place (first, last, the only one)."""
    assert len(RESPONSES) > 8
    header = kv.ResponseHeader(cluster, 1, revision, term)
    for cls in RESPONSES:
        required = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        old = cls(*(kv.ResponseHeader() if f.name == "header" else 0 for f in required))
        for f in dataclasses.fields(cls):
            value = header if f.name == "header" else getattr(old, f.name)
            quick = replace_field(old, f.name, value)
            assert type(quick) is cls and quick == dataclasses.replace(old, **{f.name: value})
    put = kv.PutRequest(b"k", b"v", 7)
    assert replace_field(put, "value", b"w") == kv.PutRequest(b"k", b"w", 7)
    assert replace_field(put, "ignore_lease", True) == dataclasses.replace(put, ignore_lease=True)
