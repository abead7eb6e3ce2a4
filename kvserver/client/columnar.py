"""Columnar reads: a range answer straight into Arrow columns, and keys by rank.

``range_arrow`` is ``range`` whose kvs come back as one ``pyarrow.RecordBatch`` (columns
``key``, ``value``, ``create_revision``, ``mod_revision``, ``version``, ``lease``) built from
the answer's bytes with no Python object per key:

1. the answer's ``"kvs":[...]`` slice is cut out of the body (the rest — header, ``more``,
   ``count`` — is a few bytes of JSON, parsed as usual); its objects are put one per line and
   parsed by Arrow's JSON reader into string columns;
2. the revisions, version and lease (decimal strings in etcd's gateway dialect) are cast to
   int64 by Arrow; absent fields (etcd omits zeros and empty values) become 0 / ``b""``;
3. keys and values are base64-decoded a whole column at a time with numpy: every item is
   padded to whole 4-character quads, so the concatenated text is a sequence of quads each
   belonging to one item; each quad gives 3 bytes, less the padding, and the items' new
   offsets are a cumulative sum.

Keys are ``string`` (``binary`` with ``key_format="binary"``): a key that is not UTF-8 raises
``ValueError`` naming it. Values are ``binary``, or ``string`` with ``value_format="string"``
(a value that is not UTF-8 raises naming its key). An answer the fast path does not
recognise (whitespace between objects, unpadded or URL-safe base64 — etcd's gateway sends
neither) is decoded the ordinary way (``codec.decode_range``), with the same result.
pyarrow and numpy are imported on first use: importing this module loads neither.

``key_ranks`` calls raftkv's ``POST /v1/ranks`` (not etcd): the live keys at given 0-based
ranks of a range, and the range's key count, in O(log N) per rank on the server — what a
reader needs to split a range into parts of equal key counts without reading the keys. The
server answers at its current revision; ``exact`` is false when an older ``revision`` was
asked (the ranks are then those of the current revision, see ``kvserver.api.http.ranks``).
"""

from __future__ import annotations

import json
from binascii import a2b_base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvserver.client import codec
from kvserver.client.errors import (
    ClientError,
    CompactedError,
    FutureRevisionError,
    InvalidArgumentError,
    NotFoundError,
    ResponseFormatError,
    UnimplementedError,
)
from kvserver.client.retry import RetryEngine, Route
from kvserver.client.txn import KeyLike, range_request
from kvserver.kvpb.kv import ResponseHeader

if TYPE_CHECKING:
    import pyarrow as pa

RANKS_PATH = "/v1/ranks"
MAX_RANKS_PER_CALL = 4096  # the server's limit
COLUMNS = ("key", "value", "create_revision", "mod_revision", "version", "lease")
_INT_COLUMNS = COLUMNS[2:]
_KVS_OPEN = b'"kvs":['
MSG_COMPACTED = "required revision has been compacted"
MSG_FUTURE = "required revision is a future revision"


@dataclass(frozen=True, slots=True)
class KeyRanks:
    """Keys at ranks of a range: ``keys[i]`` is at rank ``ranks[i]`` (None past the end)."""

    header: ResponseHeader
    count: int  # live keys in the range at header.revision
    keys: tuple[bytes | None, ...]
    exact: bool  # False: an older revision was asked; these are the current revision's

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class ArrowRange:
    """A range answer with its kvs as one Arrow record batch."""

    header: ResponseHeader
    batch: pa.RecordBatch
    more: bool
    count: int

    @property
    def revision(self) -> int:
        return self.header.revision

    def last_key(self) -> bytes | None:
        """The last key of the batch as bytes (where the next page starts after)."""
        if self.batch.num_rows == 0:
            return None
        last = self.batch.column(0)[self.batch.num_rows - 1].as_py()
        return last.encode("utf-8") if isinstance(last, str) else last


# ---------------------------------------------------------------------------------------------
# Decoding


def schema(value_format: str = "binary", key_format: str = "string") -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string() if key_format == "string" else pa.binary()),
            ("value", pa.string() if value_format == "string" else pa.binary()),
            *((name, pa.int64()) for name in _INT_COLUMNS),
        ]
    )


_EQ = ord("=")


class _NotFast(Exception):
    """The answer is not in the shape the fast path decodes."""


def b64decode_array(arr: pa.Array) -> pa.BinaryArray:
    """Standard padded base64 strings (nulls: empty) -> their bytes, a column at a time."""
    import numpy as np

    if arr.null_count:
        arr = arr.fill_null("")
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    first, last = int(offsets[0]), int(offsets[-1])
    data = arr.buffers()[2]
    raw = bytes(memoryview(data)[first:last]) if data is not None and last > first else b""
    return _b64decode(raw, offsets - first)


def _b64decode(raw: bytes, offsets: Any) -> pa.BinaryArray:
    """Items ``raw[offsets[i]:offsets[i + 1]]`` (padded base64) -> a binary array."""
    import numpy as np
    import pyarrow as pa

    n = len(offsets) - 1
    if (offsets & 3).any():
        raise _NotFast("base64 text not in whole quads")
    nquads = len(raw) // 4
    # One little-endian uint32 per quad: characters 0..3 in bytes 0..3.
    chars = np.frombuffer(raw, dtype="<u4")
    pad2 = (chars >> 16 & 0xFF) == _EQ
    pad3 = (chars >> 24) == _EQ
    padded = bool(pad3.any())
    if padded or pad2.any():
        if ((chars & 0xFF) == _EQ).any() or ((chars >> 8 & 0xFF) == _EQ).any():
            raise _NotFast("misplaced base64 padding")
        if (pad2 & ~pad3).any():
            raise _NotFast("misplaced base64 padding")
        is_end = np.zeros(nquads, dtype=bool)
        ends = offsets[1:] // 4 - 1
        is_end[ends[ends >= 0]] = True  # each non-empty item's last quad
        if (pad3 & ~is_end).any():
            raise _NotFast("base64 padding inside an item")
    try:
        # Padding read as 'A' (zero bits): every quad decodes to 3 bytes, in one C call;
        # the bytes that stood for padding are dropped below.
        full = a2b_base64(raw.replace(b"=", b"A"), strict_mode=True)
    except ValueError:
        raise _NotFast("not standard base64") from None
    if not padded:
        out = np.frombuffer(full, dtype=np.uint8)
        new_offsets = (offsets // 4) * 3
    else:
        per_quad = 3 - pad2.astype(np.int32) - pad3.astype(np.int32)
        cum = np.zeros(nquads + 1, dtype=np.int32)
        np.cumsum(per_quad, out=cum[1:])
        new_offsets = cum[offsets // 4]
        lengths = np.diff(offsets)
        dec = np.diff(new_offsets)
        if n and (lengths == lengths[0]).all() and (dec == dec[0]).all():
            # Items of one size (the usual fixed-size keys or values): a strided copy.
            rows = np.frombuffer(full, dtype=np.uint8).reshape(n, -1)
            out = np.ascontiguousarray(rows[:, : int(dec[0])])
        else:
            keep = np.ones(nquads * 3, dtype=bool)
            keep[1::3] = ~pad2
            keep[2::3] = ~pad3
            out = np.frombuffer(full, dtype=np.uint8)[keep]
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(new_offsets.astype(np.int32)), pa.py_buffer(out)]
    )


def _utf8(arr: pa.Array, keys: pa.Array, what: str) -> pa.Array:
    import pyarrow as pa

    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        for i, item in enumerate(arr.to_pylist()):  # only to name the culprit
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                key = keys[i].as_py()
                if what == "key":
                    raise ValueError(f"key {key!r} is not UTF-8") from None
                raise ValueError(f"the value of key {key!r} is not UTF-8") from None
        raise


def _batch(columns: dict[str, Any], value_format: str, key_format: str) -> pa.RecordBatch:
    """The record batch from raw key/value bytes columns and int64 columns."""
    import pyarrow as pa

    keys = columns["key"]
    out = [
        _utf8(keys, keys, "key") if key_format == "string" else keys,
        _utf8(columns["value"], keys, "value") if value_format == "string" else columns["value"],
        *(columns[name] for name in _INT_COLUMNS),
    ]
    return pa.RecordBatch.from_arrays(out, schema=schema(value_format, key_format))


def _split(body: bytes) -> tuple[dict[str, Any], bytes]:
    """(the answer without its kvs, parsed; the kvs' text between the brackets)."""
    at = body.find(_KVS_OPEN)
    if at < 0:
        return json.loads(body), b""
    start = at + len(_KVS_OPEN)
    end = body.find(b"]", start)  # base64 and decimal text hold no ']'
    if end < 0:
        raise ResponseFormatError("range answer: unterminated kvs")
    rest = body[:at] + b'"kvs":[]' + body[end + 1 :]
    return json.loads(rest), body[start:end]


# The usual KeyValue object of a range answer, as raftkv's and etcd's gateways write it:
# {"key":"..","create_revision":"..","mod_revision":"..","version":"..","value":".."} —
# 20 quotes, the names in this order. Lengths of the five names (tokens 0, 2, 4, 6, 8).
_CANONICAL_NAMES = (b"key", b"create_revision", b"mod_revision", b"version", b"value")
_QUOTE = ord('"')


def _digits(text: Any, start: Any, end: Any) -> Any:
    """Decimal integers text[start[i]:end[i]] (1..19 digits each) -> int64, vectorized."""
    import numpy as np

    length = end - start
    if len(length) and (length.min() < 1 or length.max() > 19):
        raise _NotFast("not a decimal integer")
    value = np.zeros(len(start), dtype=np.int64)
    for i in range(int(length.max()) if len(length) else 0):
        live = i < length
        d = text[np.where(live, start + i, 0)].astype(np.int64) - 48
        if ((d < 0) | (d > 9))[live].any():
            raise _NotFast("not a decimal integer")
        value = np.where(live, value * 10 + d, value)
    return value


def _gather(text: Any, start: Any, end: Any) -> tuple[bytes, Any]:
    """The concatenation of text[start[i]:end[i]] and its offsets."""
    import numpy as np

    length = (end - start).astype(np.int64)
    offsets = np.zeros(len(start) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    if len(length) and (length == length[0]).all():
        idx = start[:, None] + np.arange(int(length[0]))  # one size: a 2-D gather
        return text[idx].tobytes(), offsets
    idx = np.repeat(start - offsets[:-1], length) + np.arange(int(offsets[-1]))
    return text[idx].tobytes(), offsets


def _canonical_columns(kvs_text: bytes) -> dict[str, Any]:
    """Columns of kvs that are all in the usual shape (else ``_NotFast``): found by the
    positions of their quotes, with no JSON parser."""
    import numpy as np
    import pyarrow as pa

    text = np.frombuffer(kvs_text, dtype=np.uint8)
    quotes = np.flatnonzero(text == _QUOTE)
    if len(quotes) % 20:
        raise _NotFast("not the usual KeyValue shape")
    q = quotes.reshape(-1, 20)
    n = len(q)
    if n == 0 or np.count_nonzero(text == ord("{")) != n:  # an object without 20 quotes
        raise _NotFast("not the usual KeyValue shape")
    for j, name in enumerate(_CANONICAL_NAMES):  # the names, checked by length and letters
        lo, hi = q[:, 4 * j] + 1, q[:, 4 * j + 1]
        if ((hi - lo) != len(name)).any():
            raise _NotFast("not the usual KeyValue shape")
        for i in (0, len(name) - 1):
            if (text[lo + i] != name[i]).any():
                raise _NotFast("not the usual KeyValue shape")
    # Each object opens right before its first quote and closes right after its last.
    if n and ((text[q[:, 0] - 1] != ord("{")).any() or (text[q[:, 19] + 1] != ord("}")).any()):
        raise _NotFast("not the usual KeyValue shape")
    key_raw, key_off = _gather(text, q[:, 2] + 1, q[:, 3])
    value_raw, value_off = _gather(text, q[:, 18] + 1, q[:, 19])
    return {
        "key": _b64decode(key_raw, key_off),
        "value": _b64decode(value_raw, value_off),
        "create_revision": pa.array(_digits(text, q[:, 6] + 1, q[:, 7]), pa.int64()),
        "mod_revision": pa.array(_digits(text, q[:, 10] + 1, q[:, 11]), pa.int64()),
        "version": pa.array(_digits(text, q[:, 14] + 1, q[:, 15]), pa.int64()),
        "lease": pa.array(np.zeros(n, dtype=np.int64), pa.int64()),
    }


def _fast_columns(kvs_text: bytes) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as paj

    lines = kvs_text.replace(b"},{", b"}\n{")
    fields = [(name, pa.string()) for name in COLUMNS]
    table = paj.read_json(
        pa.BufferReader(lines),
        read_options=paj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(lines) + 1)),
        parse_options=paj.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
        ),
    )
    cols = {name: table.column(name).combine_chunks() for name in COLUMNS}
    out: dict[str, Any] = {
        "key": b64decode_array(cols["key"]),
        "value": b64decode_array(cols["value"]),
    }
    zero = pa.scalar(0, pa.int64())
    for name in _INT_COLUMNS:
        out[name] = pc.cast(cols[name], pa.int64()).fill_null(zero)
    return out


def _slow_columns(doc: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa

    kvs = codec.decode_range(doc).kvs
    return {
        "key": pa.array([kv.key for kv in kvs], pa.binary()),
        "value": pa.array([kv.value for kv in kvs], pa.binary()),
        "create_revision": pa.array([kv.create_revision for kv in kvs], pa.int64()),
        "mod_revision": pa.array([kv.mod_revision for kv in kvs], pa.int64()),
        "version": pa.array([kv.version for kv in kvs], pa.int64()),
        "lease": pa.array([kv.lease for kv in kvs], pa.int64()),
    }


def decode_range_arrow(
    body: bytes, value_format: str = "binary", key_format: str = "string"
) -> ArrowRange:
    """A range answer's bytes as an ``ArrowRange`` (see the module docstring)."""
    import pyarrow as pa

    if value_format not in ("binary", "string") or key_format not in ("binary", "string"):
        raise ValueError("value_format and key_format are 'binary' or 'string'")
    try:
        doc, kvs_text = _split(body)
    except ValueError as exc:  # JSONDecodeError
        raise ResponseFormatError(f"range answer is not JSON: {exc}") from None
    if type(doc) is not dict:
        raise ResponseFormatError("range answer: expected a JSON object")
    if doc.get("kvs"):  # not the compact shape (the kvs were not cut out): the ordinary way
        columns = _slow_columns(doc)
    elif kvs_text.strip():
        try:
            try:
                columns = _canonical_columns(kvs_text)
            except _NotFast:
                columns = _fast_columns(kvs_text)
        except (_NotFast, pa.ArrowInvalid):
            doc = json.loads(body)  # decoded the ordinary way (and checked by it)
            columns = _slow_columns(doc)
    else:
        columns = _slow_columns({"kvs": []})
    head = codec.decode_range({k: v for k, v in doc.items() if k != "kvs"})
    return ArrowRange(head.header, _batch(columns, value_format, key_format), head.more, head.count)


def decode_key_ranks(doc: Any) -> KeyRanks:
    if type(doc) is not dict:
        raise ResponseFormatError("ranks answer: expected a JSON object")
    raw_keys = doc.get("keys") or []
    if not isinstance(raw_keys, list):
        raise ResponseFormatError("ranks answer: keys is not a list")
    return KeyRanks(
        header=codec.decode_header(doc.get("header")),
        count=codec.to_int(doc.get("count"), "count"),
        keys=tuple(None if k is None else codec.to_bytes(k, "keys[]") for k in raw_keys),
        exact=bool(doc.get("exact", False)),
    )


# ---------------------------------------------------------------------------------------------
# Calls (on an AsyncClient's retry engine; the clients' methods call these)


async def range_arrow(
    engine: RetryEngine,
    key: KeyLike,
    range_end: KeyLike | None = None,
    *,
    prefix: bool = False,
    limit: int = 0,
    revision: int = 0,
    serializable: bool = False,
    value_format: str = "binary",
    key_format: str = "string",
) -> ArrowRange:
    req = range_request(
        key,
        range_end=range_end,
        prefix=prefix,
        limit=limit,
        revision=revision,
        serializable=serializable,
    )
    body = json.dumps(codec.encode_range(req), separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}

    async def attempt(endpoint: str, timeout_s: float, auth_headers: dict[str, str]) -> bytes:
        return await engine.transport.send_raw(
            endpoint, "POST", "/v3/kv/range", body, {**headers, **auth_headers}, timeout_s
        )

    raw = await engine.run("range (arrow)", attempt, Route.ANY if serializable else Route.LEADER)
    return decode_range_arrow(raw, value_format, key_format)


async def key_ranks(
    engine: RetryEngine,
    key: KeyLike,
    range_end: KeyLike | None = None,
    *,
    ranks: Sequence[int],
    prefix: bool = False,
    revision: int = 0,
    serializable: bool = False,
) -> KeyRanks:
    req = range_request(key, range_end=range_end, prefix=prefix, revision=revision)
    ranks = [int(r) for r in ranks]
    if any(r < 0 for r in ranks):
        raise ValueError("ranks must be >= 0")
    if len(ranks) > MAX_RANKS_PER_CALL:
        raise ValueError(f"at most {MAX_RANKS_PER_CALL} ranks per call")
    payload: dict[str, Any] = {"key": codec.b64(req.key), "ranks": [str(r) for r in ranks]}
    if req.range_end:
        payload["range_end"] = codec.b64(req.range_end)
    if revision:
        payload["revision"] = str(revision)
    if serializable:
        payload["serializable"] = True
    try:
        return await engine.request(
            "key ranks",
            "POST",
            RANKS_PATH,
            payload,
            lambda doc, endpoint: decode_key_ranks(doc),
            Route.ANY if serializable else Route.LEADER,
        )
    except InvalidArgumentError as err:
        # /v1 paths answer errors in the REST shape (the code by name), which the client
        # maps by HTTP status: name the revision errors as a range would.
        if MSG_COMPACTED in err.message:
            raise CompactedError(
                err.message, http_status=err.http_status, endpoint=err.endpoint
            ).with_context(err.operation, err.attempts) from None
        if MSG_FUTURE in err.message:
            raise FutureRevisionError(
                err.message, http_status=err.http_status, endpoint=err.endpoint
            ).with_context(err.operation, err.attempts) from None
        raise


def ranks_unsupported(err: ClientError) -> bool:
    """Whether ``err`` from ``key_ranks`` means this server (or this user) cannot rank keys:
    a server without the endpoint (etcd: 404), or auth refusing it (it needs root)."""
    return err.http_status in (401, 403, 404, 405, 501) or isinstance(
        err, (NotFoundError, UnimplementedError)
    )
