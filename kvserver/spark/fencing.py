"""Fencing tokens: how a commit proves, inside the store, that its writer still holds a lock.

A ``FencedLock`` (``kvserver.spark.lock``) is a key attached to a lease; the key's
``create_revision`` is the **fencing token**. While the holder's lease lives, the key exists
with that create revision; when the lease expires (paused driver, partition, lost
keep-alive) the store deletes the key, and the next holder's key has a larger create
revision. So a commit txn that carries the compare ``create_revision(lock_key) == token``
succeeds only while this holder still holds the lock, decided by the store at the commit's
revision, not by the writer's clock or its belief.

``Fence`` is that pair, small and picklable so it can travel to Spark's separate task and
commit processes, as two write options (``fenceKey``, ``fenceToken``; see
``Fence.to_options`` / ``Fence.from_options``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.client.txn import Cmp
from kvserver.kvpb.kv import Compare

FENCE_KEY_OPTION = "fenceKey"
FENCE_TOKEN_OPTION = "fenceToken"


class FencedOutError(RuntimeError):
    """A guarded write was refused because the writer no longer holds its lock.

    ``key`` is the lock key, ``token`` the create revision this writer held; the store's lock
    key was gone or had another create revision when the write was decided."""

    def __init__(self, key: bytes, token: int, detail: str = "") -> None:
        self.key = key
        self.token = token
        msg = (
            f"fenced out: the lock {key.decode('utf-8', 'replace')!r} is no longer held with "
            f"fencing token {token} (its lease expired or another holder took it); "
            f"the write was refused by the store and nothing of it was applied"
        )
        super().__init__(msg + (f": {detail}" if detail else ""))


@dataclass(frozen=True, slots=True)
class Fence:
    key: bytes  # the lock key
    token: int  # its create revision while this holder holds it

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or not self.key:
            raise ValueError("a fence needs a non-empty lock key (bytes)")
        if isinstance(self.token, bool) or not isinstance(self.token, int) or self.token <= 0:
            raise ValueError(f"a fencing token is a positive revision, got {self.token!r}")

    def compare(self) -> Compare:
        """The txn compare every guarded commit must carry."""
        return Cmp.create_revision(self.key) == self.token

    def to_options(self) -> dict[str, str]:
        """Spark write options that carry this fence to task and commit processes."""
        return {FENCE_KEY_OPTION: self.key.decode("utf-8"), FENCE_TOKEN_OPTION: str(self.token)}

    @classmethod
    def from_options(cls, options: dict) -> Fence | None:
        """The fence given as write options, or None when neither option is set.

        One option without the other, or a token that is not a positive integer, is an
        error: a writer that meant to be fenced must not silently write unfenced."""
        # Spark hands options to Python data sources with keys lower-cased.
        lowered = {str(k).lower(): v for k, v in options.items()}
        key = lowered.get(FENCE_KEY_OPTION.lower())
        token = lowered.get(FENCE_TOKEN_OPTION.lower())
        if key is None and token is None:
            return None
        if key is None or token is None:
            raise ValueError(f"give both {FENCE_KEY_OPTION} and {FENCE_TOKEN_OPTION}, or neither")
        try:
            value = int(token)
        except ValueError:
            raise ValueError(
                f"{FENCE_TOKEN_OPTION} must be a revision (an integer), got {token!r}"
            ) from None
        return cls(key.encode("utf-8"), value)
