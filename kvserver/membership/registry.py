"""The replicated member registry, and the frame that carries it in snapshots.

``MemberRegistry``: member ID -> name, peer URLs, client URLs, learner flag
(``kvserver.kvpb.member.Member``). It is replicated state: it changes only when a conf-change
entry is applied, identically on every node. The entry's ``context`` carries the member as
etcd's JSON (``Member.to_json``): ADD_NODE / ADD_LEARNER_NODE add (or promote) a member,
REMOVE_NODE removes it for good (its ID can never come back), UPDATE_NODE changes attributes
(name and client URLs published by the member, or peer URLs). Which IDs are members, and which
of them are learners, always follows the raft ``ConfState`` the change produced (so a change
raft ignored is ignored here too). Entries without context (the bootstrap entries of a new
cluster) take names and peer URLs from the ``known`` members (``--initial-cluster``). A member
is *started* once it has a name. Not thread-safe: the raft task owns it.

Snapshots. The registry travels in the state machine snapshot as a frame in front of the rest:
``MEMBERS_FRAME_MAGIC | len (uint32 big-endian) | JSON`` (``frame_members`` /
``split_members_frame``; the JSON is ``{"format": 1, "members": [...], "removed": [ids]}``). A
snapshot without the frame (made before the registry existed) still restores: the registry is
rebuilt from the snapshot's ConfState and the known members (``split_members_frame`` returns
``None`` for it). A truncated frame or an unreadable registry raises ``MembersFrameError``.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Iterable
from dataclasses import replace

from kvserver.kvpb.member import Member
from raft import ConfChange, ConfChangeType, ConfState

__all__ = [
    "MEMBERS_FRAME_MAGIC",
    "MemberRegistry",
    "MembersFrameError",
    "frame_members",
    "split_members_frame",
]

log = logging.getLogger(__name__)

MEMBERS_FRAME_MAGIC = b"RKVMEMB1"
_FRAME_HEADER_BYTES = len(MEMBERS_FRAME_MAGIC) + 4
REGISTRY_FORMAT = 1


class MembersFrameError(ValueError):
    """A snapshot's member frame is truncated or unreadable."""


def frame_members(blob: bytes) -> bytes:
    return MEMBERS_FRAME_MAGIC + len(blob).to_bytes(4, "big") + blob


def split_members_frame(data: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(registry blob, rest)``; ``(None, data)`` for a snapshot without the frame."""
    view = memoryview(data)
    if view[: len(MEMBERS_FRAME_MAGIC)] != MEMBERS_FRAME_MAGIC:
        return None, view
    if len(view) < _FRAME_HEADER_BYTES:
        raise MembersFrameError("truncated member frame")
    n = int.from_bytes(view[len(MEMBERS_FRAME_MAGIC) : _FRAME_HEADER_BYTES], "big")
    end = _FRAME_HEADER_BYTES + n
    if len(view) < end:
        raise MembersFrameError("truncated member frame")
    return bytes(view[_FRAME_HEADER_BYTES:end]), view[end:]


class MemberRegistry:
    """Replicated member table; see the module docstring. Not thread-safe (raft task only)."""

    def __init__(self, known: Iterable[Member] = ()):
        # Attributes for IDs that appear in conf changes without context (bootstrap entries).
        self.known: dict[int, Member] = {m.id: m for m in known}
        self.members: dict[int, Member] = {}
        self.removed: set[int] = set()

    def list(self) -> tuple[Member, ...]:
        return tuple(self.members[i] for i in sorted(self.members))

    def get(self, mid: int) -> Member | None:
        return self.members.get(mid)

    def _placeholder(self, mid: int) -> Member:
        return self.known.get(mid) or Member(mid, "", ())

    def apply(self, cc: ConfChange, conf_state: ConfState) -> None:
        """Apply a committed conf change; ``conf_state`` is what raft made of it."""
        ctx = None
        if cc.context:
            try:
                obj = json.loads(cc.context)
                ctx = obj if isinstance(obj, dict) else None
            except ValueError:
                log.warning("conf change %s: unreadable context ignored", cc)
        mid = cc.node_id
        if cc.type == ConfChangeType.UPDATE_NODE:
            m = self.members.get(mid)
            if m is not None and ctx is not None:
                self.members[mid] = _merge(m, ctx)
        elif cc.type in (ConfChangeType.ADD_NODE, ConfChangeType.ADD_LEARNER_NODE):
            m = self.members.get(mid) or self._placeholder(mid)
            if ctx is not None:
                m = _merge(m, ctx)
            if mid in conf_state.voters or mid in conf_state.learners:
                self.members[mid] = m
                self.removed.discard(mid)
        elif cc.type == ConfChangeType.REMOVE_NODE:
            if mid not in conf_state.voters and mid not in conf_state.learners and mid:
                self.members.pop(mid, None)
                self.removed.add(mid)
        self.reconcile(conf_state)

    def reconcile(self, conf_state: ConfState) -> None:
        """Make the set of members and learner flags agree with ``conf_state``."""
        ids = set(conf_state.voters) | set(conf_state.learners)
        for mid in list(self.members):
            if mid not in ids:
                del self.members[mid]
        for mid in ids:
            m = self.members.get(mid) or self._placeholder(mid)
            learner = mid in conf_state.learners
            if m.is_learner != learner or mid not in self.members:
                self.members[mid] = replace(m, is_learner=learner)

    def snapshot(self) -> bytes:
        return json.dumps(
            {
                "format": REGISTRY_FORMAT,
                "members": [m.to_json() for m in self.list()],
                "removed": sorted(self.removed),
            },
            separators=(",", ":"),
        ).encode()

    def restore(self, blob: bytes | None, conf_state: ConfState) -> None:
        """Replace the table with a snapshot's (``None``: a snapshot made before the
        registry existed: rebuilt from ``conf_state`` and the known attributes)."""
        self.members = {}
        if blob is not None:
            try:
                obj = json.loads(blob)
                if obj.get("format") != REGISTRY_FORMAT:
                    raise ValueError(f"unknown registry format {obj.get('format')!r}")
                members = [Member.from_json(m) for m in obj["members"]]
                removed = {int(i) for i in obj.get("removed", ())}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MembersFrameError(f"bad member registry in snapshot: {exc}") from None
            self.members = {m.id: m for m in members}
            self.removed = removed
        self.reconcile(conf_state)

    def is_started(self, mid: int) -> bool:
        m = self.members.get(mid)
        return m is not None and bool(m.name)

    # ``list`` in this class body is the method above, hence builtins.list.
    def voters(self) -> builtins.list[Member]:
        return [m for m in self.list() if not m.is_learner]

    def learners(self) -> builtins.list[Member]:
        return [m for m in self.list() if m.is_learner]


def _merge(m: Member, ctx: dict) -> Member:
    """``m`` with the attributes present in a conf-change context."""

    def urls(key, old):
        value = ctx.get(key)
        return tuple(str(u) for u in value) if isinstance(value, list) else old

    name = ctx.get("name")
    return replace(
        m,
        name=str(name) if isinstance(name, str) and name else m.name,
        peer_urls=urls("peerURLs", m.peer_urls),
        client_urls=urls("clientURLs", m.client_urls),
    )
