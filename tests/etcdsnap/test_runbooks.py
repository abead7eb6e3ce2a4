"""docs/operations.md's runbooks "Migrating from etcd" and "Back to etcd", run as written.

The ``sh`` blocks of the two sections are taken from the document and run by bash, in
order, each in a session of its own (what they start with ``&`` is stopped at the end),
with ``$ROOT_PASSWORD`` set and the ports of ``127.0.0.1:NNNN`` replaced by free ones:

1. by snapshot: from a real etcd 3.4 (``populate``: history, a compaction, a lease, users,
   auth) to a new raftkv member, which then answers etcdctl exactly as etcd did;
2. by mirror: the same etcd into another, empty raftkv member; after the cutover it holds
   every key with etcd's value (the marker too), and auth is on;
3. back to etcd: from the raftkv member of (1) to a new etcd, which answers as the first
   etcd did (passwords included).

Slow; external (etcd, etcdctl).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvserver.localcluster.launcher import free_ports
from tests.etcd_process import etcd_process
from tests.etcdsnap.helpers import ROOT, contents, observe, populate
from tests.support.etcdctl import Etcdctl

pytestmark = [pytest.mark.slow, pytest.mark.external]

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BLOCK_TIMEOUT_S = 180


def section_blocks(title: str) -> list[str]:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start : end if end > 0 else None], re.S)


def run_block(script: str, ports: dict[int, int], cwd: Path, sessions: list[int]) -> str:
    for doc_port, port in ports.items():
        script = script.replace(f"127.0.0.1:{doc_port}", f"127.0.0.1:{port}")
    unmapped = set(re.findall(r"127\.0\.0\.1:(\d+)", script)) - {str(p) for p in ports.values()}
    assert not unmapped, f"the runbook uses ports the test does not map: {unmapped}"
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        "ROOT_PASSWORD": "rootpw",
        "ETCDCTL_API": "3",
        "HOME": str(cwd),
    }
    log_path = cwd / f"block{len(sessions)}.log"
    with open(log_path, "w") as log:  # a file: what the block starts with & writes on
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    sessions.append(proc.pid)
    try:
        proc.wait(BLOCK_TIMEOUT_S)  # bash exits at the block's end; its & children go on
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = log_path.read_text()[-4000:]
    assert proc.returncode == 0, f"runbook block failed (exit {proc.returncode}):\n{output}"
    return output


def test_migration_runbooks_as_written(tmp_path):
    snapshot_block, mirror_block = section_blocks("Migrating from etcd")
    [back_block] = section_blocks("Back to etcd")
    sessions: list[int] = []
    (tmp_path / "etcd").mkdir()
    try:
        with etcd_process(str(tmp_path / "etcd")) as etcd:
            source = Etcdctl([etcd.url], "--command-timeout=30s")
            compact = populate(source)
            original = observe(source, compact)
            etcd_port = int(etcd.url.rsplit(":", 1)[1])

            r1_client, r1_peer, m1_client, m1_peer, e1_client, e1_peer = free_ports(6)
            run_block(
                snapshot_block,
                {2379: etcd_port, 12379: r1_client, 12380: r1_peer},
                tmp_path,
                sessions,
            )
            r1 = Etcdctl([f"http://127.0.0.1:{r1_client}"], "--command-timeout=30s")
            assert observe(r1, compact) == original

            run_block(
                mirror_block,
                {2379: etcd_port, 12379: m1_client, 12380: m1_peer},
                tmp_path,
                sessions,
            )
            m1 = Etcdctl([f"http://127.0.0.1:{m1_client}"], "--command-timeout=30s")
            assert contents(m1, "", *ROOT) == contents(source, "", *ROOT)
            assert contents(m1, "migration/", *ROOT) == {"migration/cutover": "done"}

        run_block(
            back_block, {12379: r1_client, 2379: e1_client, 2380: e1_peer}, tmp_path, sessions
        )
        e1 = Etcdctl([f"http://127.0.0.1:{e1_client}"], "--command-timeout=30s")
        assert observe(e1, compact) == original
    finally:
        for pgid in sessions:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
