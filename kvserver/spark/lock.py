"""A fenced lock for drivers: lease + create-if-absent txn, waiters served in creation order.

Algorithm (etcd's ``concurrency.Mutex``, plus signalling of loss):

- ``acquire()`` grants a lease with ``ttl`` seconds, keeps it alive in the background (on the
  blocking ``Client``'s own loop thread, every ~ttl/3), and puts its **own** key
  ``<prefix><name>/<lease id, 16 hex digits>`` attached to that lease, in a txn that creates
  it only if absent. The key's ``create_revision`` is this candidate's place in the queue.
- The **holder** is the key of the prefix with the smallest create revision. A waiter
  watches the deletion of the key just before its own (not the holder's: no thundering
  herd), and re-checks when it goes; it holds the lock when no key older than its own is
  left.
- The **fencing token** is the holder's key's create revision. ``fence()`` returns
  ``Fence(key, token)``; a commit that carries ``fence.compare()`` (``create_revision(key) ==
  token``) is applied by the store only while that key still exists with that create
  revision, i.e. only while this holder still holds the lock. Tokens of successive holders
  increase (a later holder's key was created later).

What "losing the lock" means, and how it is signalled. The store deletes the holder's key
when its lease expires (the keep-alive did not get through within the TTL: a paused driver,
a partition, an overloaded machine) or is revoked, or when someone deletes the key. Then
the next waiter holds the lock. The holder learns it from a monitor thread that watches its
key and its keep-alive; the first of

- a DELETE of the key (seen through a watch from the key's creation on, so none is missed),
- the keep-alive stopping with an error (no refresh succeeded within the TTL, counted from
  when the last good refresh was *sent*, which is no later than the server's own expiry;
  or the lease is gone),
- the watch failing for good,

sets ``lost`` (a ``threading.Event``), stores ``lost_reason``, and calls ``on_lost(reason)``
once (on the monitor thread; an exception in the callback is logged, not raised). From then
on ``fence()`` and ``check()`` raise ``FencedOutError``. The signal is best-effort in time
(a SIGSTOPped process runs no code until it is resumed); the **store's refusal of a fenced
commit is not**: whatever the holder believes, a txn carrying the fence compare of a lost
lock is not applied.

``release()`` stops the monitor and the keep-alive and revokes the lease (the key goes with
it, which wakes the next waiter). ``with FencedLock(...) as lock:`` acquires and releases.
A lock object is reusable after ``release()``; acquiring it twice without releasing is an
error. The lock takes a blocking ``kvserver.client.Client`` (usable from any thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvserver.client import Client, Cmp, LeaseNotFoundError, Op, SyncKeepAlive, Txn
from kvserver.client.errors import ClientError
from kvserver.client.txn import as_bytes
from kvserver.spark.fencing import Fence, FencedOutError
from kvserver.spark.txn_reads import range_kvs

log = logging.getLogger("raftkv.spark.lock")

DEFAULT_PREFIX = "__raftkv/locks/"
POLL_S = 0.2  # how often waiting and monitoring threads look at the keep-alive and deadline

__all__ = ["DEFAULT_PREFIX", "FencedLock", "LockTimeoutError"]


class LockTimeoutError(TimeoutError):
    """``acquire(timeout=...)`` ran out before this candidate held the lock; its queue key
    was withdrawn (its lease revoked), so it holds nothing and blocks nobody."""


class FencedLock:
    """See the module docstring. ``on_lost(reason)`` is called once when a held lock is lost."""

    def __init__(
        self,
        client: Client,
        name: str,
        ttl: int = 10,
        *,
        on_lost: Callable[[str], object] | None = None,
        prefix: str = DEFAULT_PREFIX,
        value: str | bytes = b"",
        acquire_timeout: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a lock needs a non-empty name")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl is a whole number of seconds >= 1, got {ttl!r}")
        self.client = client
        self.name = name
        self.ttl = ttl
        self.prefix = as_bytes(prefix) + as_bytes(name) + b"/"
        self.on_lost = on_lost
        self.value = as_bytes(value, "value")
        self.acquire_timeout = acquire_timeout
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self._guard = threading.Lock()
        self._key: bytes | None = None
        self._token: int | None = None
        self._lease_id: int | None = None
        self._keepalive: SyncKeepAlive | None = None
        self._monitor: threading.Thread | None = None
        self._stop = threading.Event()

    # -----------------------------------------------------------------------------------------
    # State

    @property
    def key(self) -> bytes | None:
        """This holder's key (``None`` unless acquired)."""
        return self._key

    @property
    def token(self) -> int | None:
        """The fencing token (the key's create revision), ``None`` unless acquired."""
        return self._token

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    @property
    def held(self) -> bool:
        """Acquired, not released, and no loss signalled (the store may know better: see
        ``fence()``)."""
        return self._token is not None and not self.lost.is_set()

    def __repr__(self) -> str:
        state = ("lost" if self.lost.is_set() else "held") if self._token else "free"
        return f"FencedLock({self.name!r}, ttl={self.ttl}, {state}, token={self._token})"

    def check(self) -> None:
        """Raise ``FencedOutError`` if the lock was lost (or ``RuntimeError`` if not held)."""
        self.fence()

    def fence(self) -> Fence:
        """The fence that guarded commits carry. Raises ``FencedOutError`` once a loss was
        signalled, ``RuntimeError`` when the lock is not held at all."""
        key, token = self._key, self._token
        if key is None or token is None:
            raise RuntimeError(f"lock {self.name!r} is not held (acquire it first)")
        if self.lost.is_set():
            raise FencedOutError(key, token, self.lost_reason or "lost")
        return Fence(key, token)

    # -----------------------------------------------------------------------------------------
    # Acquire / release

    def acquire(self, timeout: float | None = None) -> Fence:
        """Block until this candidate holds the lock (at most ``timeout`` seconds: then
        ``LockTimeoutError``); returns the fence. ``FencedOutError`` if this candidate's own
        queue key vanished while it waited (its lease expired: keep-alive failures)."""
        with self._guard:
            if self._lease_id is not None:
                raise RuntimeError(
                    f"lock {self.name!r} is already held or being acquired by this object"
                )
            self._lease_id = -1  # reserved while acquiring
        deadline = None if timeout is None else time.monotonic() + timeout
        self.lost.clear()
        self.lost_reason = None
        self._stop.clear()
        lease = None
        try:
            lease = self.client.lease_grant(self.ttl)
            self._lease_id = lease.id
            self._keepalive = self.client.keep_alive(lease.id)
            key = self.prefix + f"{lease.id:016x}".encode()
            my_rev = self._enqueue(key, lease.id)
            self._wait_turn(key, my_rev, deadline)
        except BaseException:
            self._cleanup(lease.id if lease is not None else None)
            raise
        self._key, self._token = key, my_rev
        self._monitor = threading.Thread(
            target=self._watch_loss,
            args=(key, my_rev, lease.id),
            name=f"raftkv-lock-{self.name}",
            daemon=True,
        )
        self._monitor.start()
        log.info("lock %r acquired: key %s, fencing token %d", self.name, key, my_rev)
        return Fence(key, my_rev)

    def release(self) -> None:
        """Give the lock up (or stop waiting): no loss is signalled for it. Idempotent."""
        self._stop.set()  # from here on the monitor signals nothing
        monitor, self._monitor = self._monitor, None
        lease_id = self._lease_id
        # Revoke first (the next waiter goes at once), then wait for the monitor's poll to end.
        self._cleanup(lease_id if lease_id not in (None, -1) else None)
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(10.0)

    def __enter__(self) -> FencedLock:
        self.acquire(self.acquire_timeout)
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _cleanup(self, lease_id: int | None) -> None:
        ka, self._keepalive = self._keepalive, None
        if ka is not None:
            ka.close()
        if lease_id is not None:
            try:
                self.client.lease_revoke(lease_id)  # deletes our key: the next waiter goes
            except LeaseNotFoundError:
                pass  # expired already
            except ClientError as exc:
                # The key goes when the lease expires (within ttl): nobody waits forever.
                log.warning(
                    "lock %r: revoking lease %x failed (%s); it expires within %d s",
                    self.name,
                    lease_id,
                    exc,
                    self.ttl,
                )
        self._key = self._token = None
        self._lease_id = None

    def _enqueue(self, key: bytes, lease_id: int) -> int:
        """Create our key if absent; its create revision (our place in the queue)."""
        result = self.client.txn(
            Txn()
            .when(Cmp.create_revision(key) == 0)
            .then(Op.put(key, self.value, lease=lease_id))
            .otherwise(Op.get(key))
        )
        if result.succeeded:
            return result.revision  # the put's revision is the key's create revision
        kvs = range_kvs(result, 0)  # only if the key already exists: reuse its place
        if not kvs:
            raise ClientError(f"lock {self.name!r}: queue key {key!r} vanished at creation")
        return kvs[0].create_revision

    def _queue(self) -> tuple[int, list]:
        rr = self.client.range(
            self.prefix, prefix=True, keys_only=True, sort_target="create", sort_order="ascend"
        )
        return rr.revision, list(rr.kvs)

    def _keepalive_error(self) -> BaseException | None:
        ka = self._keepalive
        return None if ka is None else ka.error

    def _wait_turn(self, key: bytes, my_rev: int, deadline: float | None) -> None:
        while True:
            revision, queue = self._queue()
            if not any(kv.key == key for kv in queue):
                raise FencedOutError(
                    key,
                    my_rev,
                    "our queue key vanished while waiting for "
                    "the lock (its lease expired or was revoked)",
                )
            older = [kv for kv in queue if kv.create_revision < my_rev]
            if not older:
                return
            ahead = older[-1]  # the key just before ours
            log.debug(
                "lock %r: waiting for %s (create revision %d) to go",
                self.name,
                ahead.key,
                ahead.create_revision,
            )
            with self.client.watch(
                ahead.key, start_revision=revision + 1, filters=["NOPUT"]
            ) as events:
                while True:
                    error = self._keepalive_error()
                    if error is not None:
                        raise FencedOutError(
                            key, my_rev, f"keep-alive failed while waiting for the lock: {error}"
                        )
                    step = POLL_S
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise LockTimeoutError(
                                f"lock {self.name!r} not acquired in time: "
                                f"{len(older)} holder/waiter(s) ahead"
                            )
                        step = min(step, left)
                    try:
                        if events.get(timeout_s=step) is not None:
                            break  # the key ahead went: look at the queue again
                    except TimeoutError:
                        continue

    # -----------------------------------------------------------------------------------------
    # Loss detection

    def _signal_lost(self, reason: str) -> None:
        with self._guard:
            if self.lost.is_set() or self._stop.is_set():
                return
            self.lost_reason = reason
            self.lost.set()
        log.warning("lock %r lost (fencing token %s): %s", self.name, self._token, reason)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:
                log.exception("lock %r: the on_lost callback failed", self.name)

    def _watch_loss(self, key: bytes, my_rev: int, lease_id: int) -> None:
        try:
            events = self.client.watch(key, start_revision=my_rev + 1, filters=["NOPUT"])
        except Exception as exc:  # noqa: BLE001 - any failure to watch is reported as a loss
            self._signal_lost(f"could not watch the lock key: {exc}")
            return
        with events:
            while not self._stop.is_set():
                error = self._keepalive_error()
                if error is not None:
                    self._signal_lost(f"keep-alive of lease {lease_id:x} failed: {error}")
                    return
                try:
                    event = events.get(timeout_s=POLL_S)
                except TimeoutError:
                    continue
                except Exception as exc:  # noqa: BLE001
                    self._signal_lost(f"watching the lock key failed: {exc}")
                    return
                if event is None:  # the watch was closed under us
                    if not self._stop.is_set():
                        self._signal_lost("the watch of the lock key ended")
                    return
                self._signal_lost(
                    f"the lock key was deleted at revision {event.revision} "
                    f"(lease expired or revoked, or the key was deleted)"
                )
                return
