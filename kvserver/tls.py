"""TLS for the client and peer listeners, etcd's flags: SSL contexts and auto-TLS.

Contract:
- ``TLSInfo`` holds one listener's flags (etcd's ``transport.TLSInfo``): a certificate and
  key (``--cert-file/--key-file`` or ``--peer-*``), a CA bundle (``--trusted-ca-file``), and
  whether clients must present a certificate signed by it (``--client-cert-auth``). An
  ``auto`` TLSInfo (``--auto-tls``) carries a self-signed pair generated once into
  ``<data-dir>/fixtures/client`` (or ``fixtures/peer``) and reused at the next start, as etcd
  does.
- ``server_context(info)``: what the listener serves with (TLS 1.2+). With client-cert-auth
  the handshake itself refuses a client without a certificate chaining to the trusted CA
  (expired, wrongly signed, or none): nothing reaches the HTTP layer.
- ``dial_context(info)``: what a member dials other members (or the leader's client URL) with:
  the same certificate as a client certificate, the trusted CA to verify the other side (the
  system CAs when none is given). Auto-TLS certificates are self-signed, so — as etcd does for
  its self-signed certificates — a member dialling with auto-TLS does not verify the other
  side: auto-TLS encrypts but does not authenticate; use real certificates for that.
- ``client_context(ca_file, cert_file, key_file)``: what a client (library, CLI, bench) uses
  for ``https://`` endpoints (etcdctl's ``--cacert --cert --key``).
- Certificates are generated with the ``cryptography`` package (installed with the ``tls``
  or ``dev`` extras, it is trustme's dependency); without it ``--auto-tls`` and ``cluster up
  --tls`` stop with ``TLSConfigError`` saying so. Private keys are written mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass

__all__ = [
    "TLSConfigError",
    "TLSInfo",
    "client_context",
    "dial_context",
    "make_cluster_pki",
    "self_cert",
    "server_context",
]


class TLSConfigError(ValueError):
    """A TLS flag, file or certificate that cannot be used; the message says which."""


@dataclass(frozen=True)
class TLSInfo:
    cert_file: str = ""
    key_file: str = ""
    trusted_ca_file: str = ""
    client_cert_auth: bool = False
    auto: bool = False  # self-signed (auto-TLS): dialling does not verify the peer

    @property
    def empty(self) -> bool:
        return not (self.cert_file and self.key_file)


def peer_common_name(transport) -> str | None:  # type: ignore[no-untyped-def]
    """The common name of the certificate a TLS peer presented and the handshake verified
    (a listener asks for one only with client-cert-auth), or None: no TLS, no certificate."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName" and value:
                return str(value)
    return None


def _load_chain(ctx: ssl.SSLContext, info: TLSInfo, what: str) -> None:
    try:
        ctx.load_cert_chain(info.cert_file, info.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(
            f"{what}: cannot load certificate {info.cert_file} with key {info.key_file}: {exc}"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca_file: str, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"{what}: cannot load trusted CA file {ca_file}: {exc}") from None


def server_context(info: TLSInfo, what: str = "client TLS") -> ssl.SSLContext:
    """The listener's context; see the module docstring."""
    if info.empty:
        raise TLSConfigError(f"{what}: a certificate and a key are needed")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, info, what)
    if info.trusted_ca_file:
        _load_ca(ctx, info.trusted_ca_file, what)
    if info.client_cert_auth:
        if not info.trusted_ca_file:
            raise TLSConfigError(
                f"{what}: client certificate authentication needs a trusted CA file"
            )
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def dial_context(info: TLSInfo, what: str = "peer TLS") -> ssl.SSLContext:
    """A member's context for dialling other members; see the module docstring."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not info.empty:
        _load_chain(ctx, info, what)
    if info.auto and not info.trusted_ca_file:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif info.trusted_ca_file:
        _load_ca(ctx, info.trusted_ca_file, what)
    else:
        ctx.load_default_certs()
    return ctx


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client's context for ``https://`` endpoints: verify with ``ca_file`` (else the
    system CAs), present ``cert_file``/``key_file`` when given (both or neither)."""
    if bool(cert_file) != bool(key_file):
        raise TLSConfigError(
            "a client certificate needs its key and a key its certificate "
            "(give both --cert and --key)"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        _load_ca(ctx, ca_file, "client TLS")
    else:
        ctx.load_default_certs()
    if cert_file:
        _load_chain(ctx, TLSInfo(cert_file=cert_file, key_file=key_file or ""), "client TLS")
    return ctx


@dataclass(frozen=True)
class MemberTLS:
    """A member's contexts (None where that side has no TLS)."""

    client_server: ssl.SSLContext | None = None  # the client listener (https URLs)
    client_dial: ssl.SSLContext | None = None  # forwarding to the leader's client URL
    peer_server: ssl.SSLContext | None = None  # the peer listener (https URLs)
    peer_dial: ssl.SSLContext | None = None  # streams and snapshots to other members
    client_info: TLSInfo | None = None  # the client listener's files (front ends load them)


def _hosts(urls) -> list[str]:
    from urllib.parse import urlsplit

    return [h for h in (urlsplit(u).hostname for u in urls) if h and h not in ("0.0.0.0", "::")]


def member_contexts(cfg) -> MemberTLS:
    """Every context of a member from its ``ServerConfig`` (kvserver.server.config; read by name so
    this module stays below it); auto-TLS pairs are generated into the data dir first."""
    out: dict[str, ssl.SSLContext] = {}
    client_info = None
    for side, prefix, urls in (
        ("client", "", (*cfg.listen_client_urls, *cfg.advertise_client_urls)),
        ("peer", "peer_", (*cfg.listen_peer_urls, *cfg.initial_advertise_peer_urls)),
    ):
        info = TLSInfo(
            cert_file=getattr(cfg, prefix + "cert_file"),
            key_file=getattr(cfg, prefix + "key_file"),
            trusted_ca_file=getattr(cfg, prefix + "trusted_ca_file"),
            client_cert_auth=getattr(cfg, prefix + "client_cert_auth"),
        )
        if info.empty and getattr(cfg, prefix + "auto_tls"):
            auto = self_cert(os.path.join(cfg.data_dir, "fixtures", side), _hosts(urls))
            info = TLSInfo(
                cert_file=auto.cert_file,
                key_file=auto.key_file,
                trusted_ca_file=info.trusted_ca_file,
                client_cert_auth=info.client_cert_auth,
                auto=True,
            )
        if info.empty:
            continue
        out[side + "_server"] = server_context(info, f"{side} TLS")
        out[side + "_dial"] = dial_context(info, f"{side} TLS")
        if side == "client":
            client_info = info
    return MemberTLS(**out, client_info=client_info)


# --- generating certificates ------------------------------------------------------------------


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise TLSConfigError(
            "generating certificates (--auto-tls, --peer-auto-tls, cluster up --tls) needs "
            "the 'cryptography' package: pip install cryptography (or give certificate "
            "files with --cert-file/--key-file)"
        ) from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _san(x509, hosts: list[str]):
    names = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write(path: str, data: bytes, private: bool) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _issue(
    *,
    common_name: str,
    hosts: list[str],
    days: float,
    issuer=None,
    issuer_key=None,
    is_ca: bool = False,
    not_before=None,
):
    """A new EC P-256 key and its certificate (self-signed when ``issuer`` is None)."""
    x509, hashes, _, ec, eku, name_oid = _crypto()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(name_oid.ORGANIZATION_NAME, "raftkv"),
            x509.NameAttribute(name_oid.COMMON_NAME, common_name),
        ]
    )
    start = not_before or (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1))
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([eku.SERVER_AUTH, eku.CLIENT_AUTH]), critical=False
        )
        if hosts:
            builder = builder.add_extension(_san(x509, hosts), critical=False)
    cert = builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())
    return key, cert


def _pem(cert, key) -> tuple[bytes, bytes]:
    _, _, serialization, _, _, _ = _crypto()
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def self_cert(directory: str, hosts: list[str], days: float = 365) -> TLSInfo:
    """etcd's ``transport.SelfCert``: ``cert.pem``/``key.pem`` in ``directory``, generated once
    (an existing pair is reused) for ``hosts`` (IPs or DNS names) plus localhost."""
    cert_path = os.path.join(directory, "cert.pem")
    key_path = os.path.join(directory, "key.pem")
    if not (os.path.exists(cert_path) and os.path.exists(key_path)):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        key, cert = _issue(
            common_name="raftkv-auto-tls", hosts=[*hosts, "localhost", "127.0.0.1"], days=days
        )
        cert_pem, key_pem = _pem(cert, key)
        _write(key_path, key_pem, private=True)
        _write(cert_path, cert_pem, private=False)
    return TLSInfo(cert_file=cert_path, key_file=key_path, auto=True)


@dataclass(frozen=True)
class ClusterPKI:
    """A throwaway CA and what ``cluster up --tls`` gives its members and its user."""

    ca_file: str
    server_cert: str  # every member's certificate (server and client use), for hosts
    server_key: str
    client_cert: str  # a client certificate for the CLI (CN "root", as etcd's examples)
    client_key: str


def make_cluster_pki(directory: str, hosts: list[str], days: float = 365) -> ClusterPKI:
    """A CA and certificates signed by it in ``directory`` (created mode 0700); an existing
    set is reused, so a restarted local cluster keeps its CA."""
    paths = ClusterPKI(
        *(
            os.path.join(directory, n)
            for n in ("ca.pem", "member.pem", "member-key.pem", "client.pem", "client-key.pem")
        )
    )
    if all(os.path.exists(p) for p in vars(paths).values()):
        return paths
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca_key, ca = _issue(common_name="raftkv local cluster CA", hosts=[], days=days, is_ca=True)
    _write(paths.ca_file, _pem(ca, ca_key)[0], private=False)
    for cert_path, key_path, cn, names in (
        (paths.server_cert, paths.server_key, "raftkv-member", [*hosts, "localhost", "127.0.0.1"]),
        (paths.client_cert, paths.client_key, "root", []),
    ):
        key, cert = _issue(common_name=cn, hosts=names, days=days, issuer=ca, issuer_key=ca_key)
        cert_pem, key_pem = _pem(cert, key)
        _write(key_path, key_pem, private=True)
        _write(cert_path, cert_pem, private=False)
    return paths
