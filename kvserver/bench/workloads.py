"""What a benchmark sends: options, keys and values, and each workload's requests.

``BenchOptions`` is the whole configuration of one run (the CLI's flags; ``validate`` turns
bad combinations into one clear ``BenchUsageError`` before anything connects). A
``Workload`` turns a sequence number into one encoded HTTP request (``Request``): its kind
(``put``/``range``/``txn``), the bytes to send, and which statuses count as success.

Keys are ``--key-size`` bytes: the key number in decimal, zero-padded (``00000042``), so the
key space is visible in ``etcdctl get --prefix ''`` and the same for every system. The key
number is ``seq % key_space_size`` with ``--sequential-keys``, else uniformly random.
Values are ``--val-size`` bytes of ``v``.

Dialects: ``v3`` is etcd's JSON gateway (``POST /v3/kv/put|range|txn``, base64 keys and
values), served by etcd, raftkv and the PySyncObj comparison server; ``rest`` is raftkv's
``/v1/kv/{key}`` (``PUT`` body = value, ``GET``; a missing key's 404 is a valid answer to a
read). ``txn-put`` and ``watch-latency`` exist only in ``v3``.

Protocols: ``http`` (the default) sends the dialect's HTTP/1.1 requests; ``grpc`` sends the
same workloads as etcd's ``KV`` gRPC calls (``kvserver.bench.grpc_client``), with the same
keys and values (``Keys`` is what both share). gRPC has no dialects and no
``watch-latency`` here.
"""

from __future__ import annotations

import base64
import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvserver.bench.http import encode_request
from kvserver.tls import TLSConfigError, client_context

OPS = ("put", "range", "txn-put", "watch-latency", "mixed")
DIALECTS = ("v3", "rest")
PROTOCOLS = ("http", "grpc", "grpc-lean")


class BenchUsageError(ValueError):
    """A bad combination of options (the CLI prints it and exits 2)."""


@dataclass
class BenchOptions:
    op: str = "put"
    endpoints: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    clients: int = 1
    conns: int | None = None  # None: one connection per client
    total: int | None = None  # requests in all; None with duration None: 10000
    duration_s: float | None = None  # seconds; exclusive with total
    rate: float = 0.0  # requests/s over all clients; 0: as fast as possible
    key_size: int = 8
    val_size: int = 8
    key_space_size: int = 1
    sequential_keys: bool = False
    consistency: str = "l"  # l: linearizable reads; s: serializable
    target_leader: bool = False
    dialect: str = "v3"
    protocol: str = "http"  # grpc, grpc-lean: etcd's KV calls instead of HTTP requests
    procs: int = 1
    txn_ops: int = 1  # txn-put: puts per transaction
    read_ratio: float = 0.5  # mixed: fraction of reads
    watchers: int = 10  # watch-latency: watch streams on the key
    timeout_s: float = 10.0  # one request's deadline
    seed: int | None = None
    # https endpoints (etcdctl's --cacert/--cert/--key): paths, so the options pickle to the
    # load-generator processes; each builds its context with ssl_for()
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    # etcd v3 auth: the token every request carries (``raftkv bench --user`` authenticates
    # once before the run; tokens are valid on every member)
    token: str | None = None

    def ssl_for(self, url: str):
        """The TLS context for ``url`` (None for http://); raises BenchUsageError when the
        files do not load."""
        if urlsplit(url).scheme != "https":
            return None
        try:
            return client_context(self.cacert, self.cert, self.key)
        except TLSConfigError as exc:
            raise BenchUsageError(str(exc)) from None

    def validate(self) -> BenchOptions:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise BenchUsageError(msg)

        need(self.op in OPS, f"unknown workload {self.op!r} (one of {', '.join(OPS)})")
        need(self.dialect in DIALECTS, f"--dialect must be one of {', '.join(DIALECTS)}")
        need(self.protocol in PROTOCOLS, f"--protocol must be one of {', '.join(PROTOCOLS)}")
        if self.protocol != "http":
            need(self.dialect == "v3", "--dialect rest is HTTP only (--protocol http)")
            need(self.op != "watch-latency", "watch-latency runs over HTTP only (--protocol http)")
        need(bool(self.endpoints), "--endpoints: at least one endpoint")
        for url in self.endpoints:
            parse_endpoint(url)
            self.ssl_for(url)  # certificate files load now, not in every process
        need(self.clients >= 1, "--clients must be at least 1")
        if self.conns is None:
            self.conns = self.clients
        need(
            1 <= self.conns <= self.clients,
            "--conns must be between 1 and --clients (clients share connections)",
        )
        need(
            not (self.total is not None and self.duration_s is not None),
            "give --total or --duration, not both",
        )
        if self.total is None and self.duration_s is None:
            self.total = 10000
        need(self.total is None or self.total >= 1, "--total must be at least 1")
        need(self.duration_s is None or self.duration_s > 0, "--duration must be positive")
        need(self.rate >= 0, "--rate must be >= 0 (0: unlimited)")
        need(self.key_size >= 1, "--key-size must be at least 1")
        need(self.val_size >= 0, "--val-size must be >= 0")
        need(self.key_space_size >= 1, "--key-space-size must be at least 1")
        need(
            len(str(self.key_space_size - 1)) <= self.key_size,
            f"--key-size {self.key_size} is too small for --key-space-size "
            f"{self.key_space_size} (keys are zero-padded decimal numbers)",
        )
        need(self.consistency in ("l", "s"), "--consistency must be l or s")
        need(self.procs >= 1, "--procs must be at least 1")
        need(
            self.procs <= self.conns,
            "--procs must not exceed the number of connections (each process needs one)",
        )
        need(self.txn_ops >= 1, "--txn-ops must be at least 1")
        need(
            self.txn_ops <= self.key_space_size,
            "--txn-ops must not exceed --key-space-size (a txn may not put a key twice)",
        )
        need(0.0 <= self.read_ratio <= 1.0, "--read-ratio must be between 0 and 1")
        need(self.timeout_s > 0, "--timeout must be positive")
        if self.op in ("txn-put", "watch-latency"):
            need(
                self.dialect == "v3",
                f"{self.op} needs --dialect v3 (rest has no "
                f"{'transactions' if self.op == 'txn-put' else 'watch'})",
            )
        if self.op == "watch-latency":
            need(self.watchers >= 1, "--watchers must be at least 1")
            need(self.procs == 1, "watch-latency runs in one process (--procs 1)")
        return self


STAMP_BYTES = 20  # watch-latency values start with the put's send time, "%020.9f" (so
#                   they are at least this long, whatever --val-size says)


def parse_endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchUsageError(f"endpoint {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise BenchUsageError(f"endpoint {url!r}: {exc}") from None
    return parts.hostname, port


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class Request:
    kind: str  # "put", "range" or "txn": which stats it lands in
    raw: bytes  # the encoded HTTP request
    ok: frozenset[int]  # statuses that count as success


_OK = frozenset({200})
_OK_OR_MISSING = frozenset({200, 404})


class Keys:
    """Which key a request of one client process touches, and the value: what every
    protocol's workload shares (``stream`` of ``streams``: the process's share)."""

    def __init__(self, opts: BenchOptions, stream: int, streams: int) -> None:
        self.o = opts
        self._rng = random.Random(None if opts.seed is None else opts.seed * 1000 + stream)
        self._stream, self._streams = stream, streams  # sequential keys: interleaved
        self.value = b"v" * opts.val_size
        self._serializable = opts.consistency == "s"

    def key_number(self, seq: int) -> int:
        o = self.o
        if o.sequential_keys:
            return (seq * self._streams + self._stream) % o.key_space_size
        return self._rng.randrange(o.key_space_size)

    def key(self, n: int) -> bytes:
        return str(n).zfill(self.o.key_size).encode()

    def is_read(self) -> bool:
        """mixed: is the next request a read (``--read-ratio`` of them)?"""
        return self._rng.random() < self.o.read_ratio


class Workload(Keys):
    """Builds the HTTP requests of one client process (``host`` goes in the Host header)."""

    def __init__(self, opts: BenchOptions, host: str, stream: int, streams: int) -> None:
        super().__init__(opts, stream, streams)
        self.host = host
        auth = (("Authorization", opts.token),) if opts.token else ()
        self._enc = functools.partial(encode_request, headers=auth)
        self._value_b64 = b64(self.value)
        op = opts.op
        self.next: Callable[[int], Request] = {
            "put": self._put,
            "range": self._range,
            "txn-put": self._txn,
            "mixed": self._mixed,
            "watch-latency": self._put,
        }[op]

    def _put(self, seq: int, value: bytes | None = None, key: bytes | None = None) -> Request:
        if key is None:
            key = self.key(self.key_number(seq))
        if self.o.dialect == "rest":
            raw = self._enc(
                "PUT",
                "/v1/kv/" + key.decode(),
                self.host,
                self.value if value is None else value,
                "application/octet-stream",
            )
        else:
            vb = self._value_b64 if value is None else b64(value)
            body = f'{{"key":"{b64(key)}","value":"{vb}"}}'
            raw = self._enc("POST", "/v3/kv/put", self.host, body.encode())
        return Request("put", raw, _OK)

    def _range(self, seq: int) -> Request:
        key = self.key(self.key_number(seq))
        if self.o.dialect == "rest":
            q = "?serializable=true" if self._serializable else ""
            return Request(
                "range", self._enc("GET", "/v1/kv/" + key.decode() + q, self.host), _OK_OR_MISSING
            )
        body: dict[str, str | bool] = {"key": b64(key)}
        if self._serializable:
            body["serializable"] = True
        return Request(
            "range", self._enc("POST", "/v3/kv/range", self.host, json.dumps(body).encode()), _OK
        )

    def _txn(self, seq: int) -> Request:
        n = self.o.txn_ops
        first = self.key_number(seq)
        ks = self.o.key_space_size
        puts = [
            {"request_put": {"key": b64(self.key((first + j) % ks)), "value": self._value_b64}}
            for j in range(n)
        ]
        return Request(
            "txn",
            self._enc("POST", "/v3/kv/txn", self.host, json.dumps({"success": puts}).encode()),
            _OK,
        )

    def _mixed(self, seq: int) -> Request:
        if self.is_read():
            return self._range(seq)
        return self._put(seq)

    def stamped_put(self, stamp: float) -> Request:
        """watch-latency: a put of key number 0 whose value starts with its send time."""
        head = b"%020.9f" % stamp
        return self._put(0, head + self.value[len(head) :], self.key(0))


def error_text(status: int, body: bytes) -> str:
    """A short, stable text for an error answer (the error distribution's key)."""
    msg = ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            msg = str(doc.get("message") or doc.get("error") or "")
    except ValueError:
        msg = body[:80].decode("utf-8", "replace")
    return f"HTTP {status}" + (f": {msg[:100]}" if msg else "")
