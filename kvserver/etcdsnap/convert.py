"""A member's state image -> etcd's bolt file, in a child process.

Why a child: at a million keys the conversion is seconds of CPU (decoding the image,
encoding a protobuf per version, packing pages). In a thread of the member it would take
the interpreter lock from the event loop in turns; a niced interpreter of its own
(``python -m kvserver.etcdsnap.convert``, started with ``posix_spawn`` by asyncio) costs the
member only the pipe it writes the image into.

Contract: ``await image_to_bolt(image, consistent_index=..., directory=...)`` feeds
``image`` (a ``memoryview``, e.g. the member's spilled snapshot image: ``snap.spill``) to the
child's stdin a MiB at a time, waits for it (at most ``timeout_s``), and returns the bolt
file mapped read-only (page cache, not heap; the file is unlinked once mapped) and the
child's summary (``Exported`` as a dict). A child that fails raises ``ConvertError`` with
the tail of its stderr; a cancelled call kills it. The file is written under ``directory``
(default: the system's temporary directory).

Child protocol: ``python -m kvserver.etcdsnap.convert OUT [--consistent-index N]``: image on
stdin, bolt file written to ``OUT``, one JSON line of the summary on stdout, exit 0; exit 3
and the reason on stderr when the image does not decode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import mmap
import os
import shutil
import sys
import tempfile
from typing import Any

from kvserver.etcdsnap.exporter import write_etcd_db
from kvserver.kvpb.errors import SnapshotFormatError
from snap.forked import die_with

FEED_BYTES = 1 << 20
CHILD_NICENESS = 10
DEFAULT_TIMEOUT_S = 3600.0
_FAILED = 3


class ConvertError(RuntimeError):
    """The conversion child failed; the message says how."""


async def image_to_bolt(
    image: memoryview | bytes,
    *,
    consistent_index: int = 0,
    directory: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[memoryview, dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="etcd-snapshot-", dir=directory)
    out = os.path.join(workdir, "db")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvserver.etcdsnap.convert",
        out,
        "--consistent-index",
        str(consistent_index),
        "--parent",
        str(os.getpid()),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stderr_task = asyncio.ensure_future(proc.stderr.read())
        stdout_task = asyncio.ensure_future(proc.stdout.read())
        view = memoryview(image)
        try:
            for i in range(0, len(view), FEED_BYTES):
                proc.stdin.write(bytes(view[i : i + FEED_BYTES]))
                await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died: its exit code and stderr say why
        rc = await asyncio.wait_for(proc.wait(), timeout_s)
        err = (await stderr_task).decode("utf-8", "replace")
        text = (await stdout_task).decode("utf-8", "replace")
        if rc != 0:
            raise ConvertError(f"etcd snapshot conversion failed (exit {rc}): {err[-2000:]}")
        summary = json.loads(text.strip().splitlines()[-1])
        with open(out, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        return memoryview(mapping), summary
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _read_stdin() -> bytearray:
    data = bytearray()
    stdin = sys.stdin.buffer
    while True:
        piece = stdin.read(FEED_BYTES)
        if not piece:
            return data
        data += piece


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvserver.etcdsnap.convert")
    parser.add_argument("out")
    parser.add_argument("--consistent-index", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args(argv)
    if args.parent:
        die_with(args.parent)
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICENESS)
    gc.disable()  # a short-lived process of millions of acyclic objects: collections only cost
    image = _read_stdin()
    try:
        with open(args.out, "wb") as f:
            exported = write_etcd_db(image, f, consistent_index=args.consistent_index)
    except (SnapshotFormatError, ValueError, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return _FAILED
    print(json.dumps(dataclasses.asdict(exported)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
