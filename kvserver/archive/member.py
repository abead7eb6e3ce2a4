"""The continuous archive inside ``raftkv serve`` (``--archive-url``): start, stats, stop.

``start(cfg, member_id, cluster_id, storage)`` returns a running ``ArchiverThread`` (or None
without ``--archive-url``): it reads the live WAL segment up to the WAL's write offset, so
the member's writes never wait for it. ``stats(thread)`` gives the ``/metrics`` keys
(``archive_lag_entries``, ``archive_lag_seconds``, ``archive_uploaded_bytes``,
``archive_errors``); ``stop(thread)`` makes a last pass and joins (bounded).
"""

from __future__ import annotations

import logging

from kvserver.archive.archiver import Archiver, ArchiverThread, wal_tail
from kvserver.archive.store import ObjectStore, parse_options

log = logging.getLogger(__name__)


def start(cfg, member_id: int, cluster_id: int, storage) -> ArchiverThread | None:
    if not cfg.archive_url:
        return None
    options = parse_options([o for o in cfg.archive_options.split(",") if o.strip()])
    store = ObjectStore.open(cfg.archive_url, options)
    archiver = Archiver(
        store,
        cfg.data_dir,
        cluster_id=cluster_id,
        member_id=member_id,
        name=cfg.name,
        retention=cfg.archive_retention,
        tail=lambda: wal_tail(storage.wal),
        last_index=lambda: storage.wal.last_index,
    )
    thread = ArchiverThread(archiver, max(0.05, cfg.archive_interval_ms / 1000))
    thread.start()  # opens the manifest on its first pass, off the event loop
    log.info("archiving to %s every %d ms", cfg.archive_url, cfg.archive_interval_ms)
    return thread


def stats(thread: ArchiverThread | None) -> dict:
    if thread is None:
        return {}
    entries, seconds = thread.archiver.lag()
    return {
        "archive_lag_entries": entries,
        "archive_lag_seconds": seconds,
        "archive_uploaded_bytes": thread.archiver.stats["uploaded_bytes"],
        "archive_errors": thread.archiver.stats["errors"],
    }


def stop(thread: ArchiverThread | None) -> None:
    if thread is not None:
        thread.stop()
