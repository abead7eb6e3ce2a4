"""The ``raftkv`` data source's options, parsed once into a frozen, picklable value.

Spark hands a Python data source its options as strings with lower-cased keys; ``parse``
checks every one (unknown options are refused, so a typo such as ``pagesize=`` for
``pageSize`` is not silently ignored) and names the option in every error. The meaning of each
option is documented in ``kvserver.spark.source`` (the package docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.client.txn import MAX_TXN_OPS
from kvserver.kvpb.kv import prefix_range_end

DEFAULT_MAX_TXN_BYTES = 1536 * 1024 - 16 * 1024  # under the server's 1.5 MiB request limit
DEFAULT_PAGE_SIZE = 1000
DEFAULT_MIN_PARTITION_KEYS = 50_000  # a batch read of fewer keys is one partition
DEFAULT_TXNS_IN_FLIGHT = 4  # batch write: chunk txns outstanding at once per task
DEFAULT_MARKER_PREFIX = "__raftkv_spark/"
MAX_PARTITIONS = 10_000

KNOWN = {
    "endpoints",
    "prefix",
    "key",
    "rangeend",
    "revision",
    "numpartitions",
    "pagesize",
    "valueformat",
    "timeout",
    "maxtxnops",
    "maxtxnbytes",
    "fencekey",
    "fencetoken",
    "markerprefix",
    "startingrevision",
    "skipcompacted",
    "prevvalue",
    "sourcename",
    "path",
    "changefeed",
    "testfailaftertxns",
    # changefeed: admission control and cold history (changefeed_options.py parses them)
    "maxeventspertrigger",
    "maxrevisionspertrigger",
    "archiveurl",
    "archiveoptions",
    "coldpartitions",
    "driverbufferbytes",
    # batch read: planning (one partition per at least this many keys)
    "minpartitionkeys",
    # batch write: chunk txns outstanding at once per task
    "txnsinflight",
    # TLS and auth of the client every task, planner and committer opens
    "cafile",
    "certfile",
    "keyfile",
    "user",
    "password",
    # Spark's own options that it passes through to the source too:
    "checkpointlocation",
    "queryname",
}


class OptionError(ValueError):
    """A bad option of the raftkv data source (the message names it)."""


def _int(opts: dict, name: str, default: int, lo: int, hi: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}: want an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise OptionError(f"option {name}: want {lo} <= {name} <= {hi}, got {value}")
    return value


def _bool(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: want true or false, got {raw!r}")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    endpoints: tuple[str, ...]
    key: bytes  # first key of the range (b"\0" for "every key")
    range_end: bytes  # etcd's convention: b"" one key, b"\0" every key >= key
    revision: int  # batch read: 0 = pin the current revision
    num_partitions: int
    page_size: int
    value_string: bool  # valueFormat=string
    timeout_s: float
    max_txn_ops: int
    max_txn_bytes: int
    marker_prefix: bytes
    starting_revision: str  # "earliest" | "latest" | a decimal revision
    skip_compacted: bool
    prev_value: bool
    source_name: str
    changefeed: bool
    raw: tuple[tuple[str, str], ...]  # every option as given (lower-cased keys), for Fence
    min_partition_keys: int = DEFAULT_MIN_PARTITION_KEYS  # batch read planning
    txns_in_flight: int = DEFAULT_TXNS_IN_FLIGHT  # batch write
    # the client's TLS files (paths on every Spark host) and its user; see client_options
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = None

    @property
    def single_key(self) -> bool:
        return self.range_end == b""

    def client_options(self) -> dict:
        """The ``Client`` arguments of every process that talks to the store (driver,
        planner, executors): timeouts, and ``caFile``/``certFile``/``keyFile`` (etcdctl's
        ``--cacert/--cert/--key``, files that must exist at that path wherever Spark runs a
        task) and ``user``/``password`` when given."""
        out: dict = {"timeout_s": self.timeout_s, "attempt_timeout_s": min(self.timeout_s, 10.0)}
        for name in ("ca_file", "cert_file", "key_file", "user", "password"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def parse(options, *, need_range: bool = True) -> SourceOptions:
    opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(
            f"unknown option(s) of the raftkv data source: {', '.join(unknown)} "
            f"(see kvserver.spark.source for the options)"
        )
    endpoints = tuple(e.strip() for e in opts.get("endpoints", "").split(",") if e.strip())
    if not endpoints:
        raise OptionError(
            "option endpoints: give the raftkv client URLs, comma-separated "
            "(e.g. http://127.0.0.1:2379,http://127.0.0.1:22379)"
        )
    prefix = opts.get("prefix")
    if prefix is None and "path" in opts:
        prefix = opts["path"]  # .load("jobs/") is the prefix
    key = opts.get("key")
    range_end = opts.get("rangeend")
    if prefix is not None and key is not None:
        raise OptionError("give either option prefix or option key (with rangeEnd), not both")
    if range_end is not None and key is None:
        raise OptionError("option rangeEnd needs option key")
    if prefix is not None:
        p = prefix.encode("utf-8")
        k, end = (p, prefix_range_end(p)) if p else (b"\0", b"\0")
    elif key is not None:
        if not key:
            raise OptionError("option key must not be empty (use prefix='' for every key)")
        k = key.encode("utf-8")
        end = range_end.encode("utf-8") if range_end is not None else b""
        if end not in (b"", b"\0") and end <= k:
            raise OptionError(f"option rangeEnd {range_end!r} must sort after key {key!r}")
    elif need_range:
        raise OptionError(
            "give option prefix (e.g. 'jobs/'; '' for every key) or option key "
            "(with rangeEnd for [key, rangeEnd))"
        )
    else:
        k, end = b"", b""
    value_format = opts.get("valueformat", "binary").strip().lower()
    if value_format not in ("binary", "string"):
        raise OptionError(f"option valueFormat: want binary or string, got {value_format!r}")
    timeout_raw = opts.get("timeout", "30")
    try:
        timeout_s = float(timeout_raw)
    except ValueError:
        raise OptionError(f"option timeout: want seconds, got {timeout_raw!r}") from None
    if not 0 < timeout_s <= 3600:
        raise OptionError(f"option timeout: want 0 < seconds <= 3600, got {timeout_s}")
    starting = opts.get("startingrevision", "latest").strip().lower()
    if starting not in ("earliest", "latest"):
        try:
            if int(starting) < 1:
                raise ValueError
        except ValueError:
            raise OptionError(
                f"option startingRevision: want earliest, latest or a revision "
                f">= 1, got {starting!r}"
            ) from None
    user, password = opts.get("user"), opts.get("password")
    if (user is None) != (password is None) or user == "":
        raise OptionError("options user and password: give both (user not empty), or neither")
    if opts.get("keyfile") is not None and opts.get("certfile") is None:
        raise OptionError("option keyFile needs option certFile")
    marker_prefix = opts.get("markerprefix", DEFAULT_MARKER_PREFIX).encode("utf-8")
    if not marker_prefix:
        raise OptionError("option markerPrefix must not be empty")
    return SourceOptions(
        endpoints=endpoints,
        key=k,
        range_end=end,
        revision=_int(opts, "revision", 0, 0, (1 << 63) - 1),
        num_partitions=_int(opts, "numPartitions", 4, 1, MAX_PARTITIONS),
        page_size=_int(opts, "pageSize", DEFAULT_PAGE_SIZE, 1, 100_000),
        value_string=value_format == "string",
        timeout_s=timeout_s,
        max_txn_ops=_int(opts, "maxTxnOps", MAX_TXN_OPS, 2, MAX_TXN_OPS),
        max_txn_bytes=_int(opts, "maxTxnBytes", DEFAULT_MAX_TXN_BYTES, 1024, 64 << 20),
        marker_prefix=marker_prefix,
        starting_revision=starting,
        skip_compacted=_bool(opts, "skipCompacted", False),
        prev_value=_bool(opts, "prevValue", False),
        source_name=opts.get("sourcename", ""),
        changefeed=_bool(opts, "changefeed", False),
        raw=tuple(sorted(opts.items())),
        min_partition_keys=_int(
            opts, "minPartitionKeys", DEFAULT_MIN_PARTITION_KEYS, 1, (1 << 63) - 1
        ),
        txns_in_flight=_int(opts, "txnsInFlight", DEFAULT_TXNS_IN_FLIGHT, 1, 64),
        ca_file=opts.get("cafile"),
        cert_file=opts.get("certfile"),
        key_file=opts.get("keyfile"),
        user=user,
        password=password,
    )


def check_outside_markers(o: SourceOptions) -> None:
    """Refuse a watched range that contains the marker prefix: the streaming sink's markers
    would then wake the changefeed (and show up in it)."""
    if o.range_end != b"" and _overlaps(o.key, o.range_end, o.marker_prefix):
        raise OptionError(
            f"the watched range overlaps markerPrefix "
            f"{o.marker_prefix.decode()!r}: the sink's marker keys would wake "
            f"this changefeed; choose another markerPrefix or a narrower range"
        )


def _overlaps(key: bytes, range_end: bytes, prefix: bytes) -> bool:
    """Whether [key, range_end) (etcd's convention) meets the keys starting with ``prefix``."""
    p_end = prefix_range_end(prefix)
    lo_ok = range_end == b"\0" or prefix < range_end
    hi_ok = p_end == b"\0" or key < p_end
    return lo_ok and hi_ok
