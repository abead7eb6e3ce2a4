"""etcd's snapshot files on disk: recognise one, check its SHA-256, read it.

An etcd snapshot file is a bolt database (``bolt``) in whole pages, followed, when
``etcdctl snapshot save`` wrote it, by the SHA-256 of everything before it. etcdctl's own
rule tells the two apart: a file whose size is 32 more than a multiple of 512 has the
trailer (bolt files are whole pages, multiples of 512); ``member/snap/db`` from a data dir
has none. ``open_snapshot(path)`` applies that rule, checks the hash when there is one
(streamed over the file's mapping, in the page cache), and returns a ``bolt.BoltReader`` over
the database part; a file of any other size, or a hash that does not match, is refused with
``EtcdFileError`` before anything is read.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass

from bolt import BoltReader, looks_like_bolt

HASH_BYTES = 32
SECTOR_BYTES = 512
_HASH_STEP = 4 << 20


class EtcdFileError(ValueError):
    """Not an etcd snapshot or database file, or a damaged one."""


def is_bolt_file(path: str) -> bool:
    """Whether the file at ``path`` starts like a bolt database."""
    with open(path, "rb") as f:
        return looks_like_bolt(f.read(64))


@dataclass
class OpenSnapshot:
    reader: BoltReader
    size_bytes: int  # the whole file
    sha256: str | None  # the trailer's hash (verified), None without a trailer
    _mapping: mmap.mmap

    def close(self) -> None:
        try:
            self._mapping.close()
        except BufferError:  # the reader's views still use it: unmapped when they go
            pass

    def __enter__(self) -> OpenSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_snapshot(path: str) -> OpenSnapshot:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise EtcdFileError(f"{path}: empty file")
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        view = memoryview(mapping)
        sha = None
        if size % SECTOR_BYTES == HASH_BYTES:
            body = size - HASH_BYTES
            digest = hashlib.sha256()
            for i in range(0, body, _HASH_STEP):
                digest.update(view[i : min(body, i + _HASH_STEP)])
            want = bytes(view[body:]).hex()
            if digest.hexdigest() != want:
                raise EtcdFileError(
                    f"{path}: snapshot hash mismatch: the file says sha256 {want}, its content "
                    f"hashes to {digest.hexdigest()}; the file is damaged or truncated"
                )
            sha = want
        elif size % SECTOR_BYTES:
            raise EtcdFileError(
                f"{path}: {size} bytes is neither a bolt database (whole pages) nor one "
                f"followed by its SHA-256: truncated?"
            )
        else:
            body = size
        try:
            reader = BoltReader(view[:body])
        except ValueError as exc:
            raise EtcdFileError(f"{path}: {exc}") from None
        return OpenSnapshot(reader, size, sha, mapping)
    except BaseException:
        try:
            mapping.close()
        except BufferError:  # a view still refers to it; it goes with the view
            pass
        raise
