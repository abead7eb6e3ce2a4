"""Backends for the compatibility tests: a three-node raftkv of real processes, a real etcd.

``backend`` is parametrized over both, so one test body runs against raftkv and against the
reference; a test that passes against etcd and fails against raftkv is a raftkv difference,
a test that fails against etcd is a wrong test. Each backend is started once per module
(module scope: starting a cluster costs seconds) and stopped at the end; tests isolate
themselves by key prefix.

``Backend.leader_url()`` is the client URL of the member that leads right now (etcd's one
member; raftkv's leader as every live member reports it), ``follower_url()`` one that does
not lead (etcd: its only member). ``Backend.client(url)`` makes an unmodified ``etcd3gw``
client for a URL.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import leader_of, wait_healthy
from tests.etcd_process import etcd_process
from tests.support.wait import wait_for

# Default timing (heartbeat 100 ms, election 1 s), as etcd's: lease minimum TTL 2 s on both.
RAFTKV_TIMING = ["--heartbeat-interval", "100", "--election-timeout", "1000"]
CLIENT_TIMEOUT_S = 10.0


@dataclass
class Backend:
    name: str
    urls: list[str]
    leader_url: Callable[[], str]
    follower_url: Callable[[], str]
    election_timeout_s: float = 1.0

    def client(self, url: str | None = None):  # -> etcd3gw.client.Etcd3Client
        import etcd3gw

        parts = urlsplit(url or self.leader_url())
        return etcd3gw.client(host=parts.hostname, port=parts.port, timeout=CLIENT_TIMEOUT_S)


@contextlib.contextmanager
def raftkv_backend(root: str, extra_args: tuple[str, ...] = ()) -> Iterator[Backend]:
    cluster = LocalCluster(root, size=3, extra_args=[*RAFTKV_TIMING, *extra_args])
    cluster.start()
    ok = False
    try:
        wait_healthy(cluster, timeout_s=30)

        def leader() -> str:
            return wait_for(lambda: leader_of(cluster), 20, "an agreed leader").client_url

        def follower() -> str:
            lead = leader()
            return next(n.client_url for n in cluster.nodes if n.alive() and n.client_url != lead)

        yield Backend("raftkv", cluster.endpoints, leader, follower)
        ok = True
    finally:
        cluster.stop()
        if not ok:
            for n in cluster.nodes:
                print(f"----- {n.name} log (tail) -----\n{cluster.log_tail(n, 40)}")


@contextlib.contextmanager
def etcd_backend(root: str) -> Iterator[Backend]:
    with etcd_process(root) as etcd:
        deadline = time.monotonic() + 20
        while True:  # the gateway answers reads before the member has elected itself
            try:
                etcd.put("compat/ready", "1")
                break
            except OSError:
                assert time.monotonic() < deadline, f"etcd has no leader; see {etcd.log_path}"
                time.sleep(0.1)
        yield Backend("etcd", [etcd.url], lambda: etcd.url, lambda: etcd.url)


@pytest.fixture(scope="module", params=["raftkv", "etcd"])
def backend(request, tmp_path_factory) -> Iterator[Backend]:
    root = str(tmp_path_factory.mktemp(request.param))
    factory = raftkv_backend if request.param == "raftkv" else etcd_backend
    with factory(root) as b:
        yield b
