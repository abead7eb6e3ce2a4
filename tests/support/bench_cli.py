"""``raftkv bench`` run in-process through the CLI, as a user runs it, for tests.

``bench_json(capsys, *argv, protocol=None)`` runs ``raftkv bench *argv --json`` (with
``--protocol protocol`` when given) and returns its exit code, the JSON document it printed
(None if it printed nothing) and what it wrote to stderr.

``put_200_through_the_cli(capsys, cluster, protocol=None)`` runs the put load (200 puts, 8
clients on 2 connections, 50 keys, 64-byte values) against ``cluster`` (anything with
``endpoints`` and ``revision()``, as the bench tests' ``inproc_cluster``) and asserts that it
succeeded, that every put was counted (in the total and in the histogram) and that the
cluster's revision grew by exactly 200: every put applied once. It returns the document.
"""

from __future__ import annotations

import json
from typing import Any

from kvserver import cli

PUTS = 200


def bench_json(capsys: Any, *argv: str, protocol: str | None = None) -> tuple[int, Any, str]:
    extra = ["--protocol", protocol] if protocol is not None else []
    code = cli.main(["bench", *argv, *extra, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else None, captured.err


def put_200_through_the_cli(capsys: Any, cluster: Any, protocol: str | None = None) -> Any:
    before = cluster.revision()
    code, doc, err = bench_json(
        capsys,
        "put",
        "--total",
        str(PUTS),
        "--clients",
        "8",
        "--conns",
        "2",
        "--key-space-size",
        "50",
        "--val-size",
        "64",
        "--endpoints",
        ",".join(cluster.endpoints),
        protocol=protocol,
    )
    assert code == 0, err
    assert doc["count"] == PUTS and doc["errors"] == 0
    assert sum(b["count"] for b in doc["histogram"]) == PUTS
    assert cluster.revision() == before + PUTS  # every put applied exactly once
    return doc
