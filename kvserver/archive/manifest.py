"""The per-member archive manifest: what is archived, where, and how to check it.

Layout of an archive (``<root>`` is the ``--archive-url``)::

    <root>/<cluster id, 16 hex>/<member id, 16 hex>/manifest.json
    <root>/<cluster>/<member>/snap/<term:016x>-<index:016x>.snap     a member's .snap file
    <root>/<cluster>/<member>/wal/<segment name>.<offset:016x>       bytes [offset, offset+size)
                                                                     of one WAL segment

A WAL segment is archived as one or more *parts* (consecutive byte ranges starting at frame
boundaries): the live segment's new bytes go up as a new part every pass, so nothing is
uploaded twice, and a segment is ``closed`` once a later segment exists and its last part
reaches its end. Concatenating a segment's parts gives the segment's bytes as the member
wrote them (without the zero preallocation), which ``wal`` reads as usual.

``manifest.json`` (JSON, written last and atomically, see ``store.ObjectStore.put``)::

    {"format": 1, "cluster_id": hex, "member_id": hex, "name": str, "updated_unix": float,
     "snapshots": [{"object", "index", "term", "revision", "size", "crc32c"}, ...],   oldest first
     "segments": [{"name", "seq", "first_index", "last_index", "commit", "closed",
                   "parts": [{"object", "offset", "size", "crc32c"}, ...],
                   "snapshots": [[index, term], ...]}, ...], by seq
     "timeline": [[unix time, commit index], ...]}   when the archived data reached a commit

Invariant: every object the manifest names exists with that size and CRC-32C (objects are
uploaded and checked before the manifest that names them is written; objects are deleted
only after a manifest that no longer names them is written). And every snapshot the manifest
lists has its WAL snapshot record in the archived parts of a segment (the segment's
``snapshots``): a member writes a ``.snap`` file before the WAL record that makes it its
snapshot, and a file never recorded (the member stopped, or a newer snapshot from the leader
came first) is one its own recovery ignores, and one a replay of the log cannot start from.
A segment's ``snapshots`` lists the records found while a snapshot file was waiting for its
record (not every record ever archived); manifests written before the field existed have
none and may list snapshots without records (restore then skips such a base).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

FORMAT = 1
MANIFEST = "manifest.json"
TIMELINE_MAX = 100_000


@dataclass
class Part:
    object: str
    offset: int
    size: int
    crc32c: int


@dataclass
class Segment:
    name: str
    seq: int
    first_index: int
    last_index: int = 0  # last entry index in the archived bytes (0: none yet)
    commit: int = 0  # the last hard state's commit in the archived bytes
    closed: bool = False
    parts: list[Part] = field(default_factory=list)
    # [index, term] of the WAL snapshot records found in the archived parts (see above)
    snapshots: list[list[int]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


@dataclass
class SnapshotObject:
    object: str
    index: int
    term: int
    revision: int
    size: int
    crc32c: int


@dataclass
class Manifest:
    cluster_id: int
    member_id: int
    name: str = ""
    updated_unix: float = 0.0
    snapshots: list[SnapshotObject] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)

    @staticmethod
    def prefix(cluster_id: int, member_id: int) -> str:
        return f"{cluster_id:016x}/{member_id:016x}"

    @property
    def member_prefix(self) -> str:
        return self.prefix(self.cluster_id, self.member_id)

    def segment(self, name: str) -> Segment | None:
        for s in self.segments:
            if s.name == name:
                return s
        return None

    @property
    def last_index(self) -> int:
        return max((s.last_index for s in self.segments), default=0)

    @property
    def commit(self) -> int:
        return max((s.commit for s in self.segments), default=0)

    def recorded_snapshots(self) -> set[tuple[int, int]]:
        """(index, term) of every snapshot record found in the archived WAL parts."""
        return {(int(i), int(t)) for seg in self.segments for i, t in seg.snapshots}

    def objects(self) -> set[str]:
        names = {s.object for s in self.snapshots}
        names.update(p.object for seg in self.segments for p in seg.parts)
        return names

    def to_json(self) -> bytes:
        obj = asdict(self)
        obj["format"] = FORMAT
        obj["cluster_id"] = f"{self.cluster_id:x}"
        obj["member_id"] = f"{self.member_id:x}"
        return json.dumps(obj, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            obj = json.loads(data)
            if obj.get("format") != FORMAT:
                raise ValueError(f"unknown manifest format {obj.get('format')!r}")
            return cls(
                cluster_id=int(obj["cluster_id"], 16),
                member_id=int(obj["member_id"], 16),
                name=str(obj.get("name", "")),
                updated_unix=float(obj.get("updated_unix", 0)),
                snapshots=[SnapshotObject(**s) for s in obj.get("snapshots", [])],
                segments=[
                    Segment(**{**s, "parts": [Part(**p) for p in s.get("parts", [])]})
                    for s in obj.get("segments", [])
                ],
                timeline=[list(t) for t in obj.get("timeline", [])],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}: unreadable manifest: {exc}") from None
