"""kvserver.archive: backups, the continuous archive and point-in-time restore.

How to use them: docs/backup-restore.md.

Modules, one job each:

* ``store``    — an fsspec root (file://, memory://, s3://...): atomic puts, verified gets;
* ``snapfile`` — the backup file format (header, state image, SHA-256 trailer);
* ``backup``   — ``snapshot save|status|restore`` (stream from a member, verify, restore);
* ``datadir``  — a new cluster's member data dir from a state image;
* ``manifest`` — the per-member archive manifest (objects, index ranges, sizes, CRCs);
* ``archiver`` — uploads snapshots and WAL segment parts, writes manifests, retention, lag;
* ``member``   — the archiver inside ``raftkv serve --archive-url``;
* ``pitr``     — point-in-time restore from an archive.
"""
