"""etcd3gw, unchanged, over TLS with client certificates: against a
three-member raftkv of real processes and against a real etcd, both given the same trustme
CA and certificates (``--cert-file --key-file --trusted-ca-file --client-cert-auth``).

A client presenting the CA's certificate reads and writes (plain KV, a prefix, a lease, a
watch); one without a certificate is refused. A test that fails against etcd is a wrong test.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvserver.client import Client
from kvserver.localcluster.launcher import LocalCluster
from tests.compat.conftest import RAFTKV_TIMING
from tests.etcd_process import etcd_process
from tests.tls.conftest import PKI

pytestmark = [pytest.mark.slow, pytest.mark.external]


@dataclass
class TLSBackend:
    name: str
    url: str
    pki: PKI
    cert: object  # tests.tls.conftest.Pair of the client

    def client(self, with_cert: bool = True):
        import etcd3gw

        host, port = self.url.removeprefix("https://").split(":")
        opts = {"cert_cert": self.cert.cert, "cert_key": self.cert.key} if with_cert else {}
        return etcd3gw.client(
            host=host,
            port=int(port),
            protocol="https",
            ca_cert=self.pki.ca_file,
            timeout=10,
            **opts,
        )


def _tls_flags(pki: PKI, server) -> list[str]:
    return [
        "--cert-file",
        server.cert,
        "--key-file",
        server.key,
        "--trusted-ca-file",
        pki.ca_file,
        "--client-cert-auth",
    ]


@contextlib.contextmanager
def _raftkv(root: str, pki: PKI, server, client) -> Iterator[str]:
    cluster = LocalCluster(
        root,
        size=3,
        scheme="https",
        extra_args=[
            *RAFTKV_TIMING,
            *_tls_flags(pki, server),
            "--peer-cert-file",
            server.cert,
            "--peer-key-file",
            server.key,
            "--peer-trusted-ca-file",
            pki.ca_file,
            "--peer-client-cert-auth",
        ],
    )
    cluster.start()
    ok = False
    try:
        with Client(
            cluster.endpoints,
            ca_file=pki.ca_file,
            cert_file=client.cert,
            key_file=client.key,
            timeout_s=5,
        ) as c:
            deadline = time.monotonic() + 60
            while True:  # bounded: until the three have a leader and a write commits
                dead = [n.name for n in cluster.nodes if not n.alive()]
                assert not dead, f"{dead} exited:\n{cluster.log_tail(cluster.nodes[0])}"
                try:
                    c.put("compat/ready", "1")
                    break
                except Exception:
                    assert time.monotonic() < deadline, "no TLS cluster in 60 s"
                    time.sleep(0.2)
        yield cluster.endpoints[0]
        ok = True
    finally:
        cluster.stop()
        if not ok:
            for n in cluster.nodes:
                print(f"----- {n.name} log (tail) -----\n{cluster.log_tail(n, 40)}")


@contextlib.contextmanager
def _etcd(root: str, pki: PKI, server, client) -> Iterator[str]:
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    ctx.load_cert_chain(client.cert, client.key)
    with etcd_process(
        root, extra_args=tuple(_tls_flags(pki, server)), client_scheme="https", ssl_context=ctx
    ) as etcd:
        yield etcd.url


@pytest.fixture(scope="module", autouse=True)
def _no_ca_bundle_env():
    """requests lets $REQUESTS_CA_BUNDLE/$CURL_CA_BUNDLE override a Session's ``verify``
    (psf/requests#3829), which is how etcd3gw passes ``ca_cert``: without this, the system
    bundle would be used and our CA never trusted."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("REQUESTS_CA_BUNDLE", raising=False)
        mp.delenv("CURL_CA_BUNDLE", raising=False)
        yield


@pytest.fixture(scope="module", params=["raftkv", "etcd"])
def backend(request, tmp_path_factory) -> Iterator[TLSBackend]:
    root = tmp_path_factory.mktemp(f"{request.param}-tls")
    pki = PKI(root / "pki")
    server, client = pki.pair("server"), pki.pair("client", common_name="root")
    factory = _raftkv if request.param == "raftkv" else _etcd
    with factory(str(root), pki, server, client) as url:
        yield TLSBackend(request.param, url, pki, client)


def test_kv_prefix_and_lease_over_tls_with_a_client_certificate(backend):
    c = backend.client()
    assert c.put("tls/a", "1") is True
    assert c.put("tls/b", "2") is True
    assert c.get("tls/a") == [b"1"]
    assert sorted(v for v, _ in c.get_prefix("tls/")) == [b"1", b"2"]
    lease = c.lease(ttl=30)
    assert c.put("tls/leased", "x", lease=lease) is True
    assert lease.revoke() is True
    assert c.get("tls/leased") == []
    assert c.delete_prefix("tls/")


def test_watch_over_tls(backend):
    c = backend.client()
    events, it_cancel = c.watch_prefix("tlsw/")
    got: list = []
    done = threading.Event()

    def consume():
        for ev in events:
            got.append(ev)
            if len(got) == 2:
                done.set()
                return

    threading.Thread(target=consume, daemon=True).start()
    deadline = time.monotonic() + 20
    while not done.is_set() and time.monotonic() < deadline:  # bounded: put until seen
        if not got:
            c.put("tlsw/k", "v")
            c.delete("tlsw/k")
        done.wait(0.5)
    it_cancel()
    assert done.is_set(), got
    assert [e["kv"]["key"] for e in got[:2]] == [b"tlsw/k", b"tlsw/k"]


def test_a_client_without_a_certificate_is_refused(backend):
    import etcd3gw.exceptions
    import requests

    c = backend.client(with_cert=False)
    with pytest.raises(
        (
            etcd3gw.exceptions.ConnectionFailedError,
            requests.exceptions.SSLError,
            requests.exceptions.ConnectionError,
        )
    ):
        c.put("tls/nocert", "x")
    assert backend.client().get("tls/nocert") == []
