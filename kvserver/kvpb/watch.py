"""Watch messages (etcd's etcdserverpb Watch service), shared by the watch hub and the client.

``WatchCreateRequest`` selects a key, a range ``[key, range_end)`` or every key ``>= key``
(``range_end == b"\\0"``) from ``start_revision`` (0: from the next revision). A cancel
request carries only the ``watch_id`` to cancel. ``WatchResponse`` is one message of a watch
stream: ``created`` (with the new ``watch_id``), ``canceled`` (with ``cancel_reason``, or
``compact_revision`` when the history the watcher needs is compacted), events of one revision
(``fragment`` on every part but the last of a split response), or a progress notification —
nothing but a header revision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kvserver.kvpb.kv import Event, ResponseHeader

__all__ = ["WatchCreateRequest", "WatchFilter", "WatchResponse"]


class WatchFilter(IntEnum):
    """etcdserverpb.WatchCreateRequest.FilterType."""

    NOPUT = 0
    NODELETE = 1


@dataclass(frozen=True, slots=True)
class WatchCreateRequest:
    """etcdserverpb.WatchCreateRequest. ``watch_id == 0``: the stream chooses one."""

    key: bytes = b""
    range_end: bytes = b""
    start_revision: int = 0  # 0: from the next revision
    progress_notify: bool = False
    filters: tuple[WatchFilter, ...] = ()
    prev_kv: bool = False
    watch_id: int = 0
    fragment: bool = False


@dataclass(frozen=True, slots=True)
class WatchResponse:
    """etcdserverpb.WatchResponse (field order as etcd's)."""

    header: ResponseHeader
    watch_id: int = 0
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""
    fragment: bool = False
    events: tuple[Event, ...] = ()

    @property
    def revision(self) -> int:
        return self.header.revision

    @property
    def is_progress_notify(self) -> bool:
        """clientv3's IsProgressNotify: nothing but a header revision."""
        return (
            not self.events
            and not self.created
            and not self.canceled
            and self.compact_revision == 0
            and self.header.revision != 0
        )
