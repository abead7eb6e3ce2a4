"""Backups: save a member's snapshot to a file or URL, check one, restore one into a new
cluster's data directory (``raftkv snapshot save|status|restore``).

* ``save(endpoint, dest)`` streams ``POST /v3/maintenance/snapshot`` into ``dest`` (a path or
  any fsspec URL) through a temporary name (``<dest>.part``), checks the SHA-256 trailer while
  writing, and moves it into place only when the hash matched: a failed or interrupted save
  never leaves a file under ``dest``. ``fmt`` picks the file: ``"raftkv"`` (ours, read back
  by ``status``) or ``"etcd"`` (etcd's bolt file, ``kvserver.etcdsnap``; the result then
  carries only the size and hash).
* ``status(src)`` streams the file and verifies its hash; returns the header numbers.
* ``restore(src, target)`` verifies the hash, checks that the state image decodes, and builds
  the data directory (``kvserver.archive.datadir``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import time
from collections.abc import Callable

import fsspec

from kvserver.archive import snapfile
from kvserver.archive.datadir import RestoredMember, RestoreTarget, build_data_dir
from kvserver.archive.store import ArchiveError
from kvserver.auth.store import AuthStore, split_auth_frame
from kvserver.lease.snapshot import split_snapshot
from kvserver.mvcc.store import MVCCStore
from kvserver.server.alarms import AlarmStore, split_alarm_frame

Progress = Callable[[int, int], None]  # (bytes done, bytes expected or 0)
_READ_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 20


def _url(path_or_url: str) -> str:
    return path_or_url if "://" in path_or_url else "file://" + os.path.abspath(path_or_url)


def open_fs(path_or_url: str, options: dict | None = None):
    try:
        return fsspec.core.url_to_fs(_url(path_or_url), **(options or {}))
    except (ImportError, ValueError, TypeError) as exc:
        raise ArchiveError(f"cannot open {path_or_url}: {exc}") from exc


async def _stream_save(
    endpoint: str,
    out,
    progress: Progress | None,
    timeout_s: float,
    headers: dict | None = None,
    ssl_context=None,
    fmt: str = "raftkv",
) -> tuple[int, str]:
    import aiohttp

    url = endpoint.rstrip("/") + "/v3/maintenance/snapshot"
    digest = hashlib.sha256()
    total = 0
    tail = b""  # the newest 32 bytes: the hash, once the stream ends
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(
            url,
            data=json.dumps({"format": fmt}).encode(),
            headers=headers,
            ssl=ssl_context if ssl_context is not None else True,
        ) as resp,
    ):
        if resp.status != 200:
            text = (await resp.text())[:500]
            raise ArchiveError(f"{url}: HTTP {resp.status}: {text}")
        buf = bytearray()
        ended = False
        async for data in resp.content.iter_any():
            buf += data
            if len(buf) > MAX_LINE_BYTES and b"\n" not in buf:
                raise ArchiveError(f"{url}: response line over {MAX_LINE_BYTES} bytes")
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if not line.strip():
                    continue
                obj = json.loads(line)
                if "error" in obj:
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise ArchiveError(f"{url}: the member failed the snapshot: {msg}")
                result = obj.get("result") or {}
                blob = base64.b64decode(result.get("blob", ""))
                remaining = int(result.get("remaining_bytes", 0) or 0)
                both = tail + blob
                keep = both[-snapfile.HASH_BYTES :]
                done = both[: -snapfile.HASH_BYTES] if len(both) > snapfile.HASH_BYTES else b""
                digest.update(done)
                tail = keep if len(both) > snapfile.HASH_BYTES else both
                out.write(blob)
                total += len(blob)
                if progress:
                    progress(total, total + remaining if remaining else total)
                if remaining == 0:
                    ended = True
        if not ended:
            raise ArchiveError(f"{url}: the snapshot stream ended early ({total} bytes)")
    if tail.hex() != digest.hexdigest():
        raise ArchiveError(
            f"{url}: the received snapshot's SHA-256 does not match its "
            f"trailer ({total} bytes): not saved"
        )
    return total, digest.hexdigest()


def save(
    endpoint: str,
    dest: str,
    *,
    options: dict | None = None,
    progress: Progress | None = None,
    timeout_s: float = 30.0,
    headers: dict | None = None,
    ssl_context=None,
    fmt: str = "raftkv",
) -> snapfile.SnapshotInfo:
    """``headers``: e.g. ``Authorization`` (a root token when auth is enabled);
    ``ssl_context``: verifies an ``https://`` endpoint (and presents a client certificate)."""
    fs, path = open_fs(dest, options)
    part = path + ".part"
    parent = os.path.dirname(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    try:
        with fs.open(part, "wb") as out:
            size, sha = asyncio.run(
                _stream_save(endpoint, out, progress, timeout_s, headers, ssl_context, fmt)
            )
        fs.mv(part, path)
    except BaseException:
        try:
            fs.rm_file(part)
        except Exception:  # nothing written yet
            pass
        raise
    if fmt != "raftkv":
        return snapfile.SnapshotInfo({}, size, sha)
    return status(dest, options=options)


def status(
    src: str, *, options: dict | None = None, on_image=None, progress: Progress | None = None
) -> snapfile.SnapshotInfo:
    fs, path = open_fs(src, options)
    try:
        size = int(fs.info(path)["size"])
        f = fs.open(path, "rb", block_size=_READ_BYTES)
    except FileNotFoundError:
        raise ArchiveError(f"{src}: no such snapshot file") from None
    with f:
        return snapfile.read(
            f,
            src,
            on_image=on_image,
            on_progress=(lambda n: progress(n, size)) if progress else None,
        )


def check_image(image: bytes | bytearray | memoryview) -> None:
    """Refuse an image that does not decode ([alarm frame] + [auth frame] + lease frame +
    complete MVCC stream)."""
    try:
        alarm_blob, rest = split_alarm_frame(memoryview(image))
        AlarmStore.restore(alarm_blob)
        auth_blob, rest = split_auth_frame(rest)
        AuthStore.restore(auth_blob)
        _, rest = split_snapshot(rest)
        # a MiB at a time: the store's loader refuses to buffer more than 256 MiB at once,
        # and an image of a million keys is larger than that
        MVCCStore.restore(
            bytes(rest[i : i + _READ_BYTES]) for i in range(0, len(rest), _READ_BYTES)
        )
    except Exception as exc:
        raise ArchiveError(f"the snapshot's state does not decode: {exc}") from exc


def restore(
    src: str,
    target: RestoreTarget,
    *,
    options: dict | None = None,
    progress: Progress | None = None,
) -> tuple[snapfile.SnapshotInfo, RestoredMember]:
    image = bytearray()
    info = status(src, options=options, on_image=image.extend, progress=progress)
    check_image(image)
    return info, build_data_dir(image, target)


class ProgressBar:
    """A one-line progress bar on a terminal (stderr); quiet when it is not a terminal."""

    def __init__(self, stream, label: str, enabled: bool | None = None):
        self.stream = stream
        self.label = label
        self.enabled = stream.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last = 0.0

    def __call__(self, done: int, expected: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        rate = done / max(1e-6, now - self.started) / 1e6
        if expected > done:
            frac = done / expected
            bar = "#" * int(frac * 30)
            text = f"\r{self.label} [{bar:<30}] {done / 1e6:8.1f} / ~{expected / 1e6:.1f} MB"
        else:
            text = f"\r{self.label} {done / 1e6:8.1f} MB"
        self.stream.write(f"{text}  {rate:6.1f} MB/s")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
