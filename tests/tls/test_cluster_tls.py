"""``raftkv cluster up --tls``'s cluster (``LocalCluster(tls=True)``) as real processes
(slow): a throwaway CA in ``<data-dir>/tls``, https client and peer URLs, peers
authenticated by certificate. The three members form and replicate, and the CLI works with
``--cacert`` alone (clients need not present a certificate) and with its client pair; a
fourth member added with ``member add`` joins over peer TLS and catches up."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvserver.client import Client
from kvserver.localcluster.launcher import LocalCluster

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTKV_")}
    return subprocess.run(
        [sys.executable, "-m", "kvserver.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_cluster_up_tls_forms_replicates_and_serves_the_cli(tmp_path):
    cluster = LocalCluster(str(tmp_path / "c"), size=3, tls=True)
    pki = cluster.pki
    assert all(
        n.client_url.startswith("https://") and n.peer_url.startswith("https://")
        for n in cluster.nodes
    )
    assert os.stat(pki.server_key).st_mode & 0o077 == 0
    cluster.start()
    ok = False
    try:
        with Client(cluster.endpoints, ca_file=pki.ca_file, timeout_s=5) as c:
            deadline = time.monotonic() + 90
            while True:  # bounded: until a leader commits over peer TLS
                dead = [n.name for n in cluster.nodes if not n.alive()]
                assert not dead, f"{dead} exited"
                try:
                    rev = c.put("tls/k", "v").header.revision
                    break
                except Exception:
                    assert time.monotonic() < deadline, "no TLS cluster in 90 s"
                    time.sleep(0.2)
        for node in cluster.nodes:  # every member applied it (serializable: local state)
            with Client(node.client_url, ca_file=pki.ca_file, timeout_s=10) as one:
                deadline = time.monotonic() + 30
                while (kv := one.get("tls/k", serializable=True)) is None:
                    assert time.monotonic() < deadline, f"{node.name} did not catch up"
                    time.sleep(0.1)
                assert (kv.value, kv.mod_revision) == (b"v", rev)
        endpoints = ",".join(cluster.endpoints)
        put = _cli("put", "tls/cli", "ok", "--endpoints", endpoints, "--cacert", pki.ca_file)
        assert put.returncode == 0, put.stderr
        got = _cli(
            "get",
            "tls/cli",
            "--endpoints",
            endpoints,
            "--cacert",
            pki.ca_file,
            "--cert",
            pki.client_cert,
            "--key",
            pki.client_key,
            "--json",
        )
        assert got.returncode == 0 and '"value": "ok"' in got.stdout, got.stderr
        untrusted = _cli("get", "tls/cli", "--endpoints", endpoints, "--timeout", "2")
        assert untrusted.returncode == 1 and "TLS handshake failed" in untrusted.stderr
        # A fourth member joins over peer TLS (it asks the members for the cluster over
        # https, then streams): it ends up with the data.
        node4 = cluster.joining_node("node4")
        with Client(cluster.endpoints[:3], ca_file=pki.ca_file, timeout_s=10) as c:
            c.member_add([node4.peer_url])
        cluster.start_node(node4)
        with Client(node4.client_url, ca_file=pki.ca_file, timeout_s=5) as one:
            deadline = time.monotonic() + 60
            while True:
                assert node4.alive(), cluster.log_tail(node4)
                try:
                    if (kv := one.get("tls/cli", serializable=True)) is not None:
                        break
                except Exception:
                    pass
                assert time.monotonic() < deadline, "node4 did not catch up over TLS"
                time.sleep(0.2)
            assert kv.value == b"ok"
        ok = True
    finally:
        cluster.stop()
        if not ok:
            for n in cluster.nodes:
                print(f"----- {n.name} -----\n{cluster.log_tail(n, 40)}")
