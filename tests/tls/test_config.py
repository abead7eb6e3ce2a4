"""The TLS flags in ServerConfig: etcd's names, ``RAFTKV_*`` twins, a bare
bool flag meaning true, and what is refused before anything starts — half a certificate
pair, client-cert-auth without a trusted CA, a file that cannot be read, https without
TLS material. (tests/kvserver/test_config_tls.py has the https-without-TLS messages.)"""

from __future__ import annotations

import argparse

import pytest

from kvserver.membership.identity import ClusterConfigError
from kvserver.server.config import add_server_flags, config_from_args


def _cfg(argv: list[str], environ: dict | None = None):
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    return config_from_args(parser.parse_args(argv), environ or {})


HTTPS = [
    "--listen-client-urls",
    "https://127.0.0.1:2379",
    "--advertise-client-urls",
    "https://127.0.0.1:2379",
    "--listen-peer-urls",
    "https://127.0.0.1:2380",
    "--initial-advertise-peer-urls",
    "https://127.0.0.1:2380",
]


def test_flags_and_env_twins(pki):
    pair = pki.pair("m")
    cfg = _cfg(
        [
            *HTTPS,
            "--cert-file",
            pair.cert,
            "--key-file",
            pair.key,
            "--trusted-ca-file",
            pki.ca_file,
            "--client-cert-auth",
            "--peer-auto-tls",
            "--pre-vote",
            "false",
        ]
    )
    assert (cfg.cert_file, cfg.client_cert_auth, cfg.peer_auto_tls, cfg.pre_vote) == (
        pair.cert,
        True,
        True,
        False,
    )
    env = {
        "RAFTKV_PEER_CERT_FILE": pair.cert,
        "RAFTKV_PEER_KEY_FILE": pair.key,
        "RAFTKV_PEER_TRUSTED_CA_FILE": pki.ca_file,
        "RAFTKV_PEER_CLIENT_CERT_AUTH": "true",
        "RAFTKV_AUTO_TLS": "1",
    }
    cfg = _cfg(HTTPS, env)
    assert (cfg.peer_cert_file, cfg.peer_client_cert_auth, cfg.auto_tls) == (pair.cert, True, True)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--cert-file", "CERT"], "--cert-file and --key-file go together"),
        (["--peer-key-file", "KEY"], "--peer-cert-file and --peer-key-file go together"),
        (
            ["--cert-file", "CERT", "--key-file", "KEY", "--client-cert-auth"],
            "--client-cert-auth needs --trusted-ca-file",
        ),
        (
            ["--cert-file", "/no/such/cert.pem", "--key-file", "KEY"],
            "--cert-file /no/such/cert.pem: cannot read",
        ),
        (
            ["--auto-tls"],
            "--listen-peer-urls https://127.0.0.1:2380: TLS key/cert "
            "(--peer-cert-file and --peer-key-file (or --peer-auto-tls))",
        ),
    ],
)
def test_refused_before_anything_starts(pki, extra, message):
    pair = pki.pair("m")
    argv = [pair.cert if a == "CERT" else pair.key if a == "KEY" else a for a in extra]
    with pytest.raises(ClusterConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg([*HTTPS, *argv])
