"""Object storage for backups and the archive, through fsspec (``file://``, ``memory://``,
``s3://`` ... any fsspec protocol).

``ObjectStore.open(url, options)`` resolves a URL to a filesystem and a root path. Options
are fsspec/s3fs storage options: given as ``key=value`` strings (``--archive-option``; a
dotted key makes a nested dict, ``client_kwargs.region_name=eu-west-1``; values that parse as
JSON are taken as JSON, so ``anon=false`` is a bool) merged over fsspec's own configuration,
which already reads the environment (``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_S3_KEY``, ...);
s3fs/botocore also honour ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION``.

Writes are atomic for readers: ``put`` writes ``<name>.tmp-<random>`` and then moves it to
``<name>`` (a rename on a local filesystem, a server-side copy + delete on S3, whose PUT and
COPY are atomic), then checks the size that landed. A crash leaves at most a ``.tmp-``
object, which ``remove_temporaries`` deletes; readers never see a partial ``<name>``.
"""

from __future__ import annotations

import builtins
import json
import posixpath
import uuid
from collections.abc import Iterable

import fsspec
from crc32c import crc32c  # hardware CRC-32C: the same values as raftpb.crc32c, ~100x faster

TMP_MARK = ".tmp-"


class ArchiveError(RuntimeError):
    """An archive or backup operation failed; the message says which object and why."""


class ObjectMissingError(ArchiveError):
    pass


class ObjectCorruptError(ArchiveError):
    pass


def parse_options(items: Iterable[str]) -> dict:
    """``["a=1", "client_kwargs.region_name=x"]`` -> ``{"a": 1, "client_kwargs": {...}}``."""
    out: dict = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ArchiveError(f"bad storage option {item!r}: want key=value")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ArchiveError(f"storage option {item!r} conflicts with another one")
        node[leaf] = value
    return out


def crc_of(data) -> int:
    return crc32c(data)


class ObjectStore:
    """A root directory on an fsspec filesystem; names are '/'-separated, relative."""

    def __init__(self, fs, root: str, url: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    @classmethod
    def open(cls, url: str, options: dict | None = None) -> ObjectStore:
        if "://" not in url:
            url = "file://" + posixpath.abspath(url)
        try:
            fs, root = fsspec.core.url_to_fs(url, **(options or {}))
        except (ImportError, ValueError, TypeError) as exc:
            raise ArchiveError(f"cannot open {url}: {exc}") from exc
        return cls(fs, root, url)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def where(self, name: str) -> str:
        """A name as the operator would type it (for messages)."""
        return f"{self.url.rstrip('/')}/{name}"

    # --- reading ------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self.path(name))

    def size(self, name: str) -> int | None:
        try:
            return int(self.fs.info(self.path(name))["size"])
        except FileNotFoundError:
            return None

    def get(self, name: str) -> bytes:
        try:
            return self.fs.cat_file(self.path(name))
        except FileNotFoundError:
            raise ObjectMissingError(f"archive object missing: {self.where(name)}") from None

    def get_verified(self, name: str, size: int, crc: int) -> bytes:
        data = self.get(name)
        if len(data) != size:
            raise ObjectCorruptError(
                f"archive object corrupt: {self.where(name)}: "
                f"{len(data)} bytes, the manifest says {size}"
            )
        if crc_of(data) != crc:
            raise ObjectCorruptError(
                f"archive object corrupt: {self.where(name)}: CRC-32C "
                f"{crc_of(data):08x}, the manifest says {crc:08x}"
            )
        return data

    def list(self, prefix: str = "") -> list[str]:
        """Names of every object under ``prefix`` (recursive), relative to the root."""
        self.fs.invalidate_cache()
        base = self.path(prefix).rstrip("/")
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self.root.lstrip("/") + "/"
        out = []
        for p in found:
            p = p.lstrip("/")
            if p.startswith(root):
                out.append(p[len(root) :])
        return sorted(out)

    # --- writing ------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically (temp object, then move; the size is checked)."""
        final = self.path(name)
        tmp = f"{final}{TMP_MARK}{uuid.uuid4().hex[:12]}"
        parent = posixpath.dirname(final)
        if parent:
            self.fs.makedirs(parent, exist_ok=True)
        try:
            self.fs.pipe_file(tmp, bytes(data))
            self.fs.mv(tmp, final)
        except BaseException:
            try:
                self.fs.rm_file(tmp)
            except Exception:  # the temp object may not exist; a later sweep removes it
                pass
            raise
        self.fs.invalidate_cache()
        got = self.size(name)
        if got != len(data):
            raise ArchiveError(f"upload of {self.where(name)} landed {got} bytes, not {len(data)}")

    def delete(self, name: str) -> None:
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass

    # ``builtins.list``: inside this class ``list`` names the method above
    def remove_temporaries(self, prefix: str) -> builtins.list[str]:
        gone = [n for n in self.list(prefix) if TMP_MARK in posixpath.basename(n)]
        for n in gone:
            self.delete(n)
        return gone
