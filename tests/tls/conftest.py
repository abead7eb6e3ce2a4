"""TLS test helpers: certificates from trustme CAs, members running in a background thread.

``pki`` writes a trustme CA and certificates for 127.0.0.1 into files (members and clients
need paths, as the flags take them); ``expired_pair`` issues, with ``cryptography``, a
certificate of that CA whose validity ended days ago (trustme cannot). ``ThreadMember`` runs
one ``kvserver.assembly.member.Member`` on its own event loop in a thread, so blocking clients, the
CLI's ``main`` and etcd3gw can talk to it from the test; ``stop`` is bounded.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from kvserver.assembly.member import Member
from kvserver.localcluster.launcher import free_ports
from kvserver.membership.identity import parse_initial_cluster
from kvserver.server.config import ServerConfig
from tests.support.wait import wait_for


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


class PKI:
    """A trustme CA whose PEM is ``ca_file``; ``pair(name)`` issues a certificate for
    127.0.0.1/localhost (server and client use) into ``<dir>/<name>.pem`` and ``-key.pem``."""

    def __init__(self, directory: Path, name: str = "ca"):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_file = str(self.dir / f"{name}.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)

    def pair(self, name: str, common_name: str | None = None) -> Pair:
        leaf = self.ca.issue_cert("127.0.0.1", "localhost", common_name=common_name or name)
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return Pair(str(cert), str(key))

    def expired_pair(self, name: str) -> Pair:
        """Signed by this CA, valid from 10 days ago to 9 days ago."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.ca.cert_pem.bytes())
        ca_key = serialization.load_pem_private_key(self.ca.private_key_pem.bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        assert cert.not_valid_after_utc < datetime.datetime.now(datetime.UTC)
        paths = Pair(str(self.dir / f"{name}.pem"), str(self.dir / f"{name}-key.pem"))
        Path(paths.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(paths.key).write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return paths


@pytest.fixture
def pki(tmp_path) -> PKI:
    return PKI(tmp_path / "pki")


@pytest.fixture
def other_pki(tmp_path) -> PKI:
    """A second, unrelated CA (its certificates must be refused)."""
    return PKI(tmp_path / "other-pki", name="other-ca")


def cluster_configs(
    tmp_path,
    size: int = 1,
    client: str = "http",
    peer: str = "http",
    per_member: list[dict] | None = None,
    **overrides,
) -> list[ServerConfig]:
    """``size`` members on free loopback ports, fast ticks; ``overrides`` apply to all,
    ``per_member[i]`` to member i (e.g. a different certificate)."""
    ports = free_ports(2 * size)
    initial = ",".join(f"t{i}={peer}://127.0.0.1:{ports[2 * i + 1]}" for i in range(size))
    members = tuple(parse_initial_cluster(initial, "tls-test"))
    out = []
    for i in range(size):
        c = (f"{client}://127.0.0.1:{ports[2 * i]}",)
        p = (f"{peer}://127.0.0.1:{ports[2 * i + 1]}",)
        out.append(
            ServerConfig(
                name=f"t{i}",
                data_dir=str(tmp_path / f"t{i}"),
                listen_client_urls=c,
                advertise_client_urls=c,
                listen_peer_urls=p,
                initial_advertise_peer_urls=p,
                initial_cluster=initial,
                initial_cluster_token="tls-test",
                heartbeat_interval_ms=20,
                election_timeout_ms=200,
                members=members,
                **{**overrides, **((per_member or [{}] * size)[i])},
            )
        )
    return out


class ThreadMember:
    """One member on its own event loop in a daemon thread."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.member = Member(cfg)
        try:
            self._call(self.member.start())
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return self.cfg.advertise_client_urls[0]

    def _call(self, coro, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def wait_leader(self, timeout_s: float = 30.0) -> None:
        wait_for(
            lambda: self.member.node is not None and self.member.node.is_leader,
            timeout_s,
            f"{self.cfg.name} to become leader",
            interval_s=0.02,
        )

    def revision(self) -> int:
        return self.member.node.sm.store.revision

    def stop(self) -> None:
        if self.loop.is_closed():
            return  # stopped already
        try:
            self._call(self.member.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


@pytest.fixture
def start_member():
    """``start_member(cfg)`` -> a running ThreadMember, stopped at the end of the test."""
    started: list[ThreadMember] = []

    def start(cfg: ServerConfig) -> ThreadMember:
        m = ThreadMember(cfg)
        started.append(m)
        return m

    yield start
    for m in reversed(started):
        m.stop()
