"""``raftkv snapshot restore`` and ``status`` for etcd's files (``kvserver.etcdsnap.file``).

``restore_etcd(path, target)``: open and verify the file, read the whole etcd state into a
raftkv state image (``kvserver.etcdsnap.importer``), check that the image decodes as a
member would restore it, and only then build the data directory
(``kvserver.archive.datadir.build_data_dir``: members from the restore's flags, a new
cluster). Any failure before the last step leaves nothing behind. Memory: the store, as
raftkv's own restore; the file itself is read from its mapping (page cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.archive.backup import check_image
from kvserver.archive.datadir import RestoredMember, RestoreTarget, build_data_dir
from kvserver.etcdsnap.file import open_snapshot
from kvserver.etcdsnap.importer import Summary, read_etcd_db


@dataclass(frozen=True)
class EtcdStatus:
    summary: Summary
    size_bytes: int
    sha256: str | None


def status_etcd(path: str) -> EtcdStatus:
    with open_snapshot(path) as snap:
        imported = read_etcd_db(snap.reader)
        return EtcdStatus(imported.summary, snap.size_bytes, snap.sha256)


def restore_etcd(path: str, target: RestoreTarget) -> tuple[EtcdStatus, RestoredMember]:
    with open_snapshot(path) as snap:
        imported = read_etcd_db(snap.reader)
        info = EtcdStatus(imported.summary, snap.size_bytes, snap.sha256)
    check_image(imported.image)
    return info, build_data_dir(imported.image, target)
