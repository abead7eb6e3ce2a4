"""Simple tokens (etcd's ``server/auth/simple_token.go``) and the bound on failed
authentications.

Simple tokens. ``new_token()`` is 32 random URL-safe bytes of ``secrets``, unguessable and
opaque to clients. As in etcd, the assignment goes through the raft log so that a token is
valid on every member (a follower forwards leader-only requests with the client's
``Authorization`` header, and gateway clients may switch members): the entry carries the
token's SHA-256, never the token, so neither WAL nor snapshots hold a usable secret. Each
member keeps ``TokenTable``, digest -> (user, deadline), in memory only: tokens die with the
process (a restarted member answers ``invalid auth token`` and clients authenticate again, as
with etcd's simple tokens). A token expires ``ttl_s`` after its last use (etcd's
``--auth-token-ttl``, default 300 s, refreshed on use); a user's tokens are dropped when the
user is deleted or its password changes, all tokens when auth is disabled. The table is
bounded (``max_tokens``; the least recently used go first).

Brute force (not in etcd; our choice). ``FailureLimiter`` is a token bucket per client
address: ``burst`` failed authentications at once, then ``rate_per_s`` more per second. An
address whose bucket is empty is refused before its password is even checked, with
ResourceExhausted (HTTP 429) and etcd's ``too many requests`` text plus our reason. Successes
cost nothing. At the defaults (10, then one every 2 s) a guesser gets ~43,000 guesses a day
per address instead of the ~20 per second one scrypt-bound core allows. The table of addresses
is bounded (``max_addresses``, least recently seen dropped). It counts per member: three
members allow three times the rate, which the bound still keeps small.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_TOKEN_TTL_S = 300.0
DEFAULT_MAX_TOKENS = 100_000
DEFAULT_BURST = 10
DEFAULT_RATE_PER_S = 0.5
DEFAULT_MAX_ADDRESSES = 10_000
MAX_TOKEN_CHARS = 512  # longer Authorization values are refused without hashing them


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenTable:
    def __init__(
        self,
        ttl_s: float = DEFAULT_TOKEN_TTL_S,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_tokens = max_tokens
        self.clock = clock
        self._tokens: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tokens)

    def assign(self, digest: bytes, user: str) -> None:
        self._tokens[digest] = (user, self.clock() + self.ttl_s)
        self._tokens.move_to_end(digest)
        while len(self._tokens) > self.max_tokens:
            self._tokens.popitem(last=False)

    def user_of(self, token: str) -> str | None:
        """The token's user (its TTL refreshed), or None: unknown, expired or too long."""
        if len(token) > MAX_TOKEN_CHARS:
            return None
        digest = token_digest(token)
        entry = self._tokens.get(digest)
        if entry is None:
            return None
        now = self.clock()
        user, deadline = entry
        if now >= deadline:
            del self._tokens[digest]
            return None
        self._tokens[digest] = (user, now + self.ttl_s)
        self._tokens.move_to_end(digest)
        return user

    def invalidate_user(self, user: str) -> None:
        for digest in [d for d, (u, _) in self._tokens.items() if u == user]:
            del self._tokens[digest]

    def clear(self) -> None:
        self._tokens.clear()


class FailureLimiter:
    def __init__(
        self,
        *,
        burst: int = DEFAULT_BURST,
        rate_per_s: float = DEFAULT_RATE_PER_S,
        max_addresses: int = DEFAULT_MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # level, at

    def _level(self, address: str) -> float:
        entry = self._buckets.get(address)
        if entry is None:
            return float(self.burst)
        level, at = entry
        return min(float(self.burst), level + (self.clock() - at) * self.rate_per_s)

    def allowed(self, address: str) -> bool:
        """Whether ``address`` may try a password now."""
        return self._level(address) >= 1.0

    def failed(self, address: str) -> None:
        level = self._level(address) - 1.0
        self._buckets[address] = (max(level, 0.0), self.clock())
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
