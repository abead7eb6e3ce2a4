"""Client workloads that run (as threads of the test process) while the nemesis acts.

Each workload sends requests to a random member's client URL (the client does not know
which one is down, paused or cut off), with a timeout, and records every operation in the
shared :class:`Recorder`: start/end time, outcome ``ok`` (an answer that says it happened),
``fail`` (an answer that says it did not: a txn whose compare failed, a lock already held)
or ``unknown`` (no answer or an error answer: it may still take effect). Every acknowledged
write is remembered as ``(key, revision)``; the runner later checks that each one is in the
replicated history (acknowledged writes lost).

- :class:`Register` -- puts of unique values and linearizable gets on a few keys, recorded in
  a :class:`tests.lincheck.History` for the linearizability checker; over the gateway, or over
  etcd's gRPC API (``over_grpc``, :mod:`tests.chaos.kvgrpc`). No compare-and-set here:
  a failed CAS observes the key's presence, which stops the checker from pruning pending
  puts, and a full-cluster restart leaves dozens of them -- the search then exceeds any
  budget (measured: UNKNOWN after 30M steps; the same history without the CAS checks is OK
  in 10k steps). Txn compares are exercised by the bank and lock workloads instead.
- :class:`Bank` -- transfers between accounts in txns guarded by the accounts'
  ``mod_revision``; a reader checks that every snapshot (one range = one revision; both
  linearizable and serializable reads, any member) totals the initial amount.
- :class:`LockWorkload` -- lease-backed mutex (txn ``CREATE(lock) == 0`` puts the lock key
  with the lease); the holder's fencing token is the lock key's create revision, and each
  guarded write is a txn ``CREATE(lock) == token`` that puts ``token:client:n`` into the
  resource key. :func:`tests.chaos.checks.fencing_violations` replays the history afterwards.
- :class:`Prober` -- a put every 50 ms to rotating members (each in its own thread of a pool
  large enough that hanging puts never delay the next one), to measure
  the time from a fault to the first acknowledged write invoked after it.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.chaos import kvgrpc
from tests.chaos import kvhttp as h
from tests.lincheck import History, kv

OP_TIMEOUT_S = 3.0  # generous: a loaded 2-core machine answers slowly mid-election


@dataclass(frozen=True, slots=True)
class OpRecord:
    workload: str
    op: str
    start: float  # time.monotonic()
    end: float
    outcome: str  # ok | fail | unknown
    member: int


class Recorder:
    def __init__(self):
        self._lock = threading.Lock()
        self.ops: list[OpRecord] = []
        self.acked_writes: list[tuple[str, int, str]] = []  # (key, revision, workload)
        self.problems: list[str] = []

    def op(self, workload: str, op: str, start: float, outcome: str, member: int) -> None:
        rec = OpRecord(workload, op, start, time.monotonic(), outcome, member)
        with self._lock:
            self.ops.append(rec)

    def acked(self, workload: str, keys: list[str], revision: int) -> None:
        with self._lock:
            self.acked_writes.extend((k, revision, workload) for k in keys)

    def problem(self, text: str) -> None:
        with self._lock:
            if len(self.problems) < 200:
                self.problems.append(text)


class Workload:
    name = "workload"

    def __init__(self, endpoints: list[str], recorder: Recorder, seed: int, clients: int):
        self.endpoints = endpoints
        self.recorder = recorder
        self.seed = seed
        self.clients = clients
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []

    def pick(self, rng: random.Random) -> tuple[int, str]:
        i = rng.randrange(len(self.endpoints))
        return i, self.endpoints[i]

    def start(self) -> None:
        for c in range(self.clients):
            t = threading.Thread(
                target=self._guarded, args=(c,), name=f"{self.name}-{c}", daemon=True
            )
            t.start()
            self.threads.append(t)

    def _guarded(self, cid: int) -> None:
        try:
            self.client(cid, random.Random(f"{self.seed}-{self.name}-{cid}"))
        except Exception as exc:  # noqa: BLE001 - a workload bug must show up in the report
            self.recorder.problem(f"{self.name} client {cid} crashed: {exc!r}")

    def client(self, cid: int, rng: random.Random) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            self.recorder.problem(f"{self.name}: threads still running after stop: {alive}")

    def pause_after_error(self) -> None:
        self.stop_event.wait(0.05)


class Register(Workload):
    """Linearizable register operations on ``keys`` keys (see the module docstring)."""

    name = "register"

    def __init__(self, *args, keys: int = 5, over_grpc: bool = False, **kw):
        super().__init__(*args, **kw)
        self.keys = [f"{h.PREFIX}reg/k{i}" for i in range(keys)]
        self.history = History()
        # put and get over etcd's gRPC API instead of the gateway (the same client URLs)
        self.kv = kvgrpc if over_grpc else h

    def client(self, cid: int, rng: random.Random) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            member, url = self.pick(rng)
            key = rng.choice(self.keys)
            roll = rng.random()
            start = time.monotonic()
            try:
                if roll < 0.5:
                    value = f"{cid}-{n}"
                    with self.history.record(cid, kv.put(key, value)) as rec:
                        code, body = self.kv.put(url, key, value, OP_TIMEOUT_S)
                        if code != 200:
                            raise h.NoAnswer(f"put answered {code}")
                        rev = h.revision_of(body)
                        rec.ok(kv.put_ok(rev))
                    self.recorder.acked(self.name, [key], rev)
                    self.recorder.op(self.name, "put", start, "ok", member)
                else:
                    with self.history.record(cid, kv.get(key)) as rec:
                        code, body = self.kv.get(url, key, OP_TIMEOUT_S)
                        if code != 200:
                            raise h.NoAnswer(f"get answered {code}")
                        found = h.kvs(body)
                        value = found[0]["value"] if found else None
                        rec.ok(kv.get_ok(value, found[0]["mod_revision"] if found else None))
                    self.recorder.op(self.name, "get", start, "ok", member)
            except h.NoAnswer:
                self.recorder.op(self.name, "op", start, "unknown", member)
                self.pause_after_error()

    def final_reads(self, url: str, within_s: float = 30.0) -> None:
        """One linearizable read of every key after the cluster healed (recorded too: a lost
        write shows up as a read the checker cannot place). A read that gets no answer is
        tried again until ``within_s`` has passed: a gRPC channel to a member that was killed
        and restarted fails calls at once while its reconnect backoff runs, even though the
        member is healthy again. An unanswered read changes nothing, so it is recorded as a
        failure (dropped from the history)."""
        deadline = time.monotonic() + within_s
        for key in self.keys:
            while True:
                start = time.monotonic()
                with self.history.record("final", kv.get(key)) as rec:
                    try:
                        code, body = self.kv.get(url, key, 10.0)
                        if code != 200:
                            raise h.NoAnswer(f"final get answered {code}")
                    except h.NoAnswer as exc:
                        rec.fail()
                        error: h.NoAnswer | None = exc
                    else:
                        found = h.kvs(body)
                        rec.ok(
                            kv.get_ok(
                                found[0]["value"] if found else None,
                                found[0]["mod_revision"] if found else None,
                            )
                        )
                        error = None
                if error is None:
                    self.recorder.op(self.name, "get", start, "ok", -1)
                    break
                if time.monotonic() >= deadline:
                    self.recorder.problem(f"final read of {key} failed: {error}")
                    break
                time.sleep(0.2)


class Bank(Workload):
    """Transfers between ``accounts`` accounts; the total must never change."""

    name = "bank"
    INITIAL = 100

    def __init__(self, *args, accounts: int = 5, **kw):
        super().__init__(*args, **kw)
        self.accounts = [f"{h.PREFIX}bank/a{i}" for i in range(accounts)]
        self.total = self.INITIAL * accounts
        self.reads = 0
        self.violations: list[str] = []
        self.setup_revision = 0
        # serializable reads may be stale; these count how stale (not asserted, reported)
        self.before_setup = 0  # snapshots older than the accounts
        self.went_back: list[str] = []  # a member answered an older revision than before
        self.went_back_count = 0
        self._max_revision: dict[int, int] = {}
        self._lock = threading.Lock()

    def setup(self, url: str) -> None:
        code, body = h.txn(
            url,
            [h.compare(a, "CREATE", 0) for a in self.accounts],
            [h.put_op(a, str(self.INITIAL)) for a in self.accounts],
            10.0,
        )
        assert code == 200 and body.get("succeeded"), f"bank setup: {code} {body}"
        self.setup_revision = h.revision_of(body)
        self.recorder.acked(self.name, list(self.accounts), self.setup_revision)

    def client(self, cid: int, rng: random.Random) -> None:
        if cid == 0:
            return self.reader(rng)
        while not self.stop_event.is_set():
            member, url = self.pick(rng)
            start = time.monotonic()
            try:
                code, body = h.get_prefix(url, f"{h.PREFIX}bank/", OP_TIMEOUT_S)
                if code != 200:
                    raise h.NoAnswer(f"range answered {code}")
                self.check_snapshot(body, f"transfer read via member {member}")
                accounts = {kv["key"]: kv for kv in h.kvs(body)}
                src, dst = rng.sample(self.accounts, 2)
                if src not in accounts or dst not in accounts:
                    continue
                have = int(accounts[src]["value"])
                amount = rng.randint(0, min(have, 20))
                new_src, new_dst = have - amount, int(accounts[dst]["value"]) + amount
                code, body = h.txn(
                    url,
                    [
                        h.compare(src, "MOD", accounts[src]["mod_revision"]),
                        h.compare(dst, "MOD", accounts[dst]["mod_revision"]),
                    ],
                    [h.put_op(src, str(new_src)), h.put_op(dst, str(new_dst))],
                    OP_TIMEOUT_S,
                )
                if code != 200:
                    raise h.NoAnswer(f"txn answered {code}")
                if body.get("succeeded"):
                    self.recorder.acked(self.name, [src, dst], h.revision_of(body))
                    self.recorder.op(self.name, "transfer", start, "ok", member)
                else:
                    self.recorder.op(self.name, "transfer", start, "fail", member)
            except h.NoAnswer:
                self.recorder.op(self.name, "transfer", start, "unknown", member)
                self.pause_after_error()

    def reader(self, rng: random.Random) -> None:
        while not self.stop_event.is_set():
            member, url = self.pick(rng)
            serializable = rng.random() < 0.5
            start = time.monotonic()
            try:
                code, body = h.get_prefix(
                    url, f"{h.PREFIX}bank/", OP_TIMEOUT_S, serializable=serializable
                )
                if code != 200:
                    raise h.NoAnswer(f"range answered {code}")
                self.check_snapshot(
                    body,
                    f"{'serializable' if serializable else 'linearizable'}"
                    f" read via member {member}",
                    member if serializable else None,
                )
                self.recorder.op(self.name, "read", start, "ok", member)
            except h.NoAnswer:
                self.recorder.op(self.name, "read", start, "unknown", member)
                self.pause_after_error()
            self.stop_event.wait(0.05)

    def check_snapshot(self, body: dict, where: str, member: int | None = None) -> None:
        """One range = one revision: the accounts as of that revision. At or after the
        setup revision they must be all there and total ``self.total``; before it (a stale
        serializable read) there must be none."""
        found = h.kvs(body)
        total = sum(int(kv["value"]) for kv in found)
        rev = h.revision_of(body)
        with self._lock:
            self.reads += 1
            if member is not None:
                before = self._max_revision.get(member, 0)
                if rev < before:
                    self.went_back_count += 1
                    if len(self.went_back) < 20:
                        self.went_back.append(f"{where}: revision {rev} after {before}")
                self._max_revision[member] = max(before, rev)
            if rev < self.setup_revision:
                self.before_setup += 1
                if found:
                    self.violations.append(
                        f"{where} at revision {rev} (before the accounts "
                        f"were created at {self.setup_revision}): {found}"
                    )
            elif len(found) != len(self.accounts) or total != self.total:
                self.violations.append(
                    f"{where} at revision {rev}: {len(found)} accounts "
                    f"totalling {total} (expected {len(self.accounts)} "
                    f"totalling {self.total})"
                )


class LockWorkload(Workload):
    """A lease-backed mutex with fenced writes (see the module docstring)."""

    name = "lock"
    LOCK_KEY = f"{h.PREFIX}lock/owner"
    RESOURCE_KEY = f"{h.PREFIX}lock/resource"
    TTL_S = 4

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.acquired = 0
        self.guarded_ok = 0
        self.guarded_rejected = 0
        self._lock = threading.Lock()

    def client(self, cid: int, rng: random.Random) -> None:
        while not self.stop_event.is_set():
            member, url = self.pick(rng)
            lease = self._grant(url, member)
            if not lease:
                self.pause_after_error()
                continue
            try:
                token = self._acquire(url, member, cid, lease)
                if token:
                    self._hold(rng, cid, lease, token)
                else:
                    self.stop_event.wait(rng.uniform(0.05, 0.3))
            finally:
                self._revoke(rng, lease)

    def _grant(self, url: str, member: int) -> int:
        start = time.monotonic()
        try:
            code, body = h.request(url, "/v3/lease/grant", {"TTL": str(self.TTL_S)}, OP_TIMEOUT_S)
        except h.NoAnswer:
            code, body = 0, {}
        lease = int(body.get("ID", 0)) if code == 200 else 0
        self.recorder.op(self.name, "grant", start, "ok" if lease else "unknown", member)
        return lease

    def _revoke(self, rng: random.Random, lease: int) -> None:
        member, url = self.pick(rng)
        start = time.monotonic()
        try:
            code, _ = h.request(url, "/v3/lease/revoke", {"ID": str(lease)}, OP_TIMEOUT_S)
            outcome = "ok" if code == 200 else "unknown"
        except h.NoAnswer:
            outcome = "unknown"  # the lease then expires after its TTL
        self.recorder.op(self.name, "revoke", start, outcome, member)

    def _acquire(self, url: str, member: int, cid: int, lease: int) -> int:
        start = time.monotonic()
        try:
            code, body = h.txn(
                url,
                [h.compare(self.LOCK_KEY, "CREATE", 0)],
                [h.put_op(self.LOCK_KEY, f"client-{cid}", lease)],
                OP_TIMEOUT_S,
            )
        except h.NoAnswer:
            code, body = 0, {}
        if code != 200:
            # unknown: we may hold it; the lease is revoked by the caller, which frees it
            self.recorder.op(self.name, "acquire", start, "unknown", member)
            return 0
        if not body.get("succeeded"):
            self.recorder.op(self.name, "acquire", start, "fail", member)
            return 0
        token = h.revision_of(body)  # = the lock key's create revision
        self.recorder.acked(self.name, [self.LOCK_KEY], token)
        self.recorder.op(self.name, "acquire", start, "ok", member)
        with self._lock:
            self.acquired += 1
        return token

    def _hold(self, rng: random.Random, cid: int, lease: int, token: int) -> None:
        for n in range(rng.randint(2, 5)):
            if self.stop_event.is_set():
                return
            member, url = self.pick(rng)
            start = time.monotonic()
            try:
                code, body = h.request(url, "/v3/lease/keepalive", {"ID": str(lease)}, OP_TIMEOUT_S)
                ttl = int(body.get("result", body).get("TTL", 0)) if code == 200 else 0
                self.recorder.op(self.name, "keepalive", start, "ok" if ttl > 0 else "fail", member)
                if ttl <= 0:
                    return
                start = time.monotonic()
                code, body = h.txn(
                    url,
                    [h.compare(self.LOCK_KEY, "CREATE", token)],
                    [h.put_op(self.RESOURCE_KEY, f"{token}:{cid}:{n}")],
                    OP_TIMEOUT_S,
                )
                if code != 200:
                    raise h.NoAnswer(f"guarded txn answered {code}")
            except h.NoAnswer:
                self.recorder.op(self.name, "guarded-write", start, "unknown", member)
                return
            if body.get("succeeded"):
                self.recorder.acked(self.name, [self.RESOURCE_KEY], h.revision_of(body))
                self.recorder.op(self.name, "guarded-write", start, "ok", member)
                with self._lock:
                    self.guarded_ok += 1
            else:  # fenced off: the lock is no longer ours (lease expired)
                self.recorder.op(self.name, "guarded-write", start, "fail", member)
                with self._lock:
                    self.guarded_rejected += 1
                return
            self.stop_event.wait(rng.uniform(0.02, 0.1))


class Prober:
    """One put every ``interval_s`` to rotating members; see :meth:`first_ack_after`."""

    KEY = f"{h.PREFIX}probe"

    TIMEOUT_S = 2.0

    def __init__(self, endpoints: list[str], recorder: Recorder, interval_s: float = 0.05):
        self.endpoints = endpoints
        self.recorder = recorder
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        # enough workers that puts hanging on a paused or leaderless member (TIMEOUT_S each,
        # 1/interval_s per second) never delay the next probe: its start time is the measure
        self._pool = ThreadPoolExecutor(
            max_workers=int(3 * self.TIMEOUT_S / interval_s), thread_name_prefix="probe"
        )
        self._acks: list[tuple[float, float]] = []  # (invoked, acknowledged)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop_event.wait(self.interval_s):
            n += 1
            self._pool.submit(self._one, n % len(self.endpoints), n)

    def _one(self, member: int, n: int) -> None:
        start = time.monotonic()
        try:
            code, body = h.put(self.endpoints[member], self.KEY, str(n), self.TIMEOUT_S)
        except h.NoAnswer:
            code, body = 0, {}
        if code == 200:
            end = time.monotonic()
            with self._lock:
                self._acks.append((start, end))
            self.recorder.acked("probe", [self.KEY], h.revision_of(body))
        self.recorder.op("probe", "put", start, "ok" if code == 200 else "unknown", member)

    def first_ack_after(self, t: float) -> float | None:
        """Monotonic time of the first acknowledgement of a put invoked at or after ``t``."""
        with self._lock:
            ends = [end for start, end in self._acks if start >= t]
        return min(ends) if ends else None

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
