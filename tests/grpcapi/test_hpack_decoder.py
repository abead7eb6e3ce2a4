"""kvserver.api.grpc.hpack_decoder against python-hyper's ``hpack`` as the model.

Blocks from ``hpack``'s own encoder (any header lists, Huffman or not, table size changes
between blocks, fields never indexed) decode to the same headers and leave the same dynamic
table; blocks of random bytes, and valid blocks with bytes changed, are refused by one
decoder exactly when the other refuses them. The bounds are tested by their own cases.
"""

from __future__ import annotations

import pytest
from hpack import Decoder as ModelDecoder
from hpack import Encoder, NeverIndexedHeaderTuple
from hpack.exceptions import (
    HPACKError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.api.grpc.hpack_decoder import Decoder

LIST_LIMIT = 4096
TABLE_LIMIT = 4096

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
names = st.one_of(
    st.sampled_from([":path", ":method", "content-type", "grpc-timeout", "te", "user-agent"]),
    text,
)
fields = st.tuples(names, text, st.booleans())  # (name, value, never indexed)
block_specs = st.tuples(
    st.lists(fields, max_size=12),
    st.booleans(),  # Huffman
    st.one_of(st.none(), st.integers(0, TABLE_LIMIT)),  # a table size change before it
)


def pair() -> tuple[Decoder, ModelDecoder]:
    model = ModelDecoder(max_header_list_size=LIST_LIMIT)
    model.max_allowed_table_size = TABLE_LIMIT
    return Decoder(LIST_LIMIT, TABLE_LIMIT), model


def outcome(decoder, block: bytes):
    try:
        return [tuple(h) for h in decoder.decode(block)]
    except HPACKError:
        return "refused"


def model_table(model: ModelDecoder) -> list[tuple[str, str]]:
    return [(n.decode(), v.decode()) for n, v in model.header_table.dynamic_entries]


@settings(max_examples=300, deadline=None)
@given(st.lists(block_specs, min_size=1, max_size=8))
def test_encoded_blocks_decode_as_the_model_decodes_them(specs):
    ours, model = pair()
    encoder = Encoder()
    for headers, huffman, table_size in specs:
        if table_size is not None:
            encoder.header_table_size = table_size
        block = encoder.encode(
            [NeverIndexedHeaderTuple(n, v) if never else (n, v) for n, v, never in headers],
            huffman=huffman,
        )
        expected = outcome(model, block)
        assert outcome(ours, block) == expected
        if expected == "refused":
            return  # a connection error: the connection ends, and its tables with it
        assert ours.dynamic_entries() == model_table(model)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(block_specs, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    st.binary(max_size=64),
)
def test_damaged_and_random_blocks_are_refused_exactly_when_the_model_refuses(specs, changes, tail):
    ours, model = pair()
    encoder = Encoder()
    for i, (headers, huffman, table_size) in enumerate(specs):
        if table_size is not None:
            encoder.header_table_size = table_size
        block = bytearray(encoder.encode([(n, v) for n, v, _ in headers], huffman=huffman))
        if i == len(specs) - 1:
            for at, byte in changes:
                if block:
                    block[at % len(block)] = byte
            block += tail
        expected = outcome(model, bytes(block))
        assert outcome(ours, bytes(block)) == expected
        if expected == "refused":
            return


def test_an_integer_of_more_than_five_continuation_bytes_is_refused():
    ours, _ = pair()
    # An indexed field whose index continues past the prefix: 0xFF then continuation bytes.
    with pytest.raises(HPACKError):
        ours.decode(bytes([0xFF, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]))
    ours, _ = pair()
    with pytest.raises(HPACKError):  # five continuation bytes: a value, but no such entry
        ours.decode(bytes([0xFF, 0x80, 0x80, 0x80, 0x80, 0x01]))


def test_bounds_refuse_with_hpacks_errors():
    ours, _ = pair()
    with pytest.raises(InvalidTableIndex):
        ours.decode(bytes([0x80]))  # index 0
    with pytest.raises(InvalidTableIndex):
        ours.decode(bytes([0x80 | 62]))  # the first dynamic entry of an empty table
    big = Encoder().encode([("x", "y" * LIST_LIMIT)], huffman=False)
    with pytest.raises(OversizedHeaderListError):
        pair()[0].decode(big)
    with pytest.raises(InvalidTableSizeError):
        pair()[0].decode(bytes([0x3F, 0xE2, 0x1F]))  # a size update to 4097
    small = Decoder(LIST_LIMIT, 100)  # SETTINGS said 100: the peer must shrink first
    with pytest.raises(InvalidTableSizeError):
        small.decode(bytes([0x82]))
    assert small.decode(bytes([0x3F, 0x45, 0x82])) == [(":method", "GET")]  # 100, then a field
    with pytest.raises(HPACKError):
        pair()[0].decode(bytes([0x82, 0x20]))  # a size update after a field


def test_generation_moves_exactly_when_the_table_changes():
    ours, _ = pair()
    encoder = Encoder()
    first = encoder.encode([(":path", "/etcdserverpb.KV/Range"), ("te", "trailers")])
    ours.decode(first)
    generation = ours.generation
    again = encoder.encode([(":path", "/etcdserverpb.KV/Range"), ("te", "trailers")])
    assert ours.decode(again) == [(":path", "/etcdserverpb.KV/Range"), ("te", "trailers")]
    assert ours.generation == generation  # references only
    ours.decode(encoder.encode([("grpc-timeout", "4999m")]))
    assert ours.generation > generation
