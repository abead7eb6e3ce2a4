"""Store access shared by the data source's pieces: clients opened lazily, revision errors.

Spark pickles readers, writers and partitions and runs them in separate Python processes, so
nothing here holds a client at pickling time: ``open_client`` makes one where it is used, and
its caller closes it. ``CompactedRevisionError`` names the compact revision (a range answer
does not carry it, so ``compact_revision_of`` asks a watch, whose refusal does).
"""

from __future__ import annotations

from kvserver.client import (
    Client,
    CompactedError,
    FutureRevisionError,
    WatchCompactedError,
)
from kvserver.spark.source.options import SourceOptions

COMPACT_PROBE_TIMEOUT_S = 10.0


class CompactedRevisionError(RuntimeError):
    """The revision asked for is below the store's compact revision: that history is gone."""

    def __init__(self, what: str, revision: int, compact_revision: int, hint: str = "") -> None:
        self.revision = revision
        self.compact_revision = compact_revision
        at = (
            f"compact revision {compact_revision}"
            if compact_revision
            else "compact revision unknown"
        )
        super().__init__(
            f"{what}: revision {revision} has been compacted ({at}; the oldest "
            f"revision still readable is {compact_revision or '?'})" + (f"; {hint}" if hint else "")
        )


class FutureRevisionReadError(RuntimeError):
    """The revision asked for is above the store's current revision."""


def open_client(o: SourceOptions) -> Client:
    return Client(list(o.endpoints), **o.client_options())


def compact_revision_of(client: Client, key: bytes, revision: int) -> int:
    """The store's compact revision, learned from a watch at ``revision`` (which the store
    refuses with ``compact_revision`` when that revision is compacted); 0 when the probe
    does not answer with one in time."""
    try:
        watch = client.watch(key, start_revision=max(revision, 1))
    except WatchCompactedError as err:
        return err.compact_revision
    try:
        watch.get(timeout_s=COMPACT_PROBE_TIMEOUT_S)
    except WatchCompactedError as err:
        return err.compact_revision
    except TimeoutError:
        return 0
    finally:
        watch.close()
    return 0


def check_revision(client: Client, o: SourceOptions, revision: int, what: str) -> None:
    """Raise ``CompactedRevisionError`` / ``FutureRevisionReadError`` unless ``revision`` can
    be read."""
    try:
        client.range(o.key, o.range_end or None, revision=revision, limit=1, keys_only=True)
    except CompactedError:
        compact = compact_revision_of(client, o.key, revision)
        raise CompactedRevisionError(what, revision, compact) from None
    except FutureRevisionError:
        raise FutureRevisionReadError(
            f"{what}: revision {revision} is above the store's current revision"
        ) from None


def current_compact_revision(client: Client, key: bytes) -> int:
    """The compact revision (0 when nothing was ever compacted; revision 1 always exists)."""
    try:
        client.range(key, limit=1, revision=1, keys_only=True)
        return 0
    except CompactedError:
        return compact_revision_of(client, key, 1)
