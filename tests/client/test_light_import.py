"""Importing the client (and the Spark code that runs on workers) loads no server code.

Every Spark worker imports the client; it must not pay for, or depend on, the raft core, the
MVCC store, the HTTP server side or any replicated subsystem. Each check runs in a fresh
interpreter, so modules other tests already imported do not hide a heavy import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = (
    "raft",
    "raftpb",
    "wal",
    "snap",
    "kvserver.mvcc",
    "kvserver.server",
    "kvserver.api",
    "kvserver.watch",
    "kvserver.lease",
    "kvserver.membership",
    "aiohttp.web",
)
# kvserver.native comes with the kvserver package: it only decides whether the compiled
# server modules run compiled, and imports none of them.
CLIENT_SIDE = ("kvserver.client", "kvserver.kvpb", "kvserver.tls", "kvserver.native")
SPARK_SIDE = (*CLIENT_SIDE, "kvserver.spark")
# wal_rows and wal_source read WAL files on purpose: they are not imported by the others.
SPARK_WAL_READERS = ("kvserver.spark.wal_rows", "kvserver.spark.wal_source")


def _loaded_after_import(module: str) -> list[str]:
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("kvserver.client", CLIENT_SIDE),
        ("kvserver.spark.source", SPARK_SIDE),
        ("kvserver.spark.lock", SPARK_SIDE),
        ("kvserver.spark.commitlog", SPARK_SIDE),
    ],
)
def test_import_loads_no_server_code(module: str, allowed: tuple[str, ...]) -> None:
    loaded = _loaded_after_import(module)
    heavy = [m for m in loaded if _within(m, FORBIDDEN)]
    assert heavy == [], f"importing {module} loads {heavy}"
    ours = [m for m in loaded if _within(m, ("kvserver",)) and m != "kvserver"]
    stray = [m for m in ours if not _within(m, allowed) or _within(m, SPARK_WAL_READERS)]
    assert stray == [], f"importing {module} loads {stray}"
    assert module in loaded
