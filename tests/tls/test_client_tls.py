"""Client TLS: one member with https client URLs.

Pinned here: https answers with the CA; a plaintext client to the TLS port and an https
client to a plaintext port fail cleanly (ConnectionFailedError, nothing applied, the member
keeps serving); with --client-cert-auth, no certificate, a certificate from another CA and an
expired certificate are refused in the TLS handshake (the request never reaches HTTP: the
revision does not move) while a certificate of the trusted CA works; the blocking client and
the CLI take etcdctl's --cacert/--cert/--key (and RAFTKV_CACERT/CERT/KEY).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl

import pytest

from kvserver.cli import main as cli_main
from kvserver.client import AsyncClient, Client
from kvserver.client.errors import ConnectionFailedError
from tests.tls.conftest import cluster_configs

FAST = {"timeout_s": 3.0, "attempt_timeout_s": 1.0, "retries": 2}


def _tls_member(start_member, tmp_path, pki, **flags):
    server = pki.pair("member")
    (cfg,) = cluster_configs(
        tmp_path, client="https", cert_file=server.cert, key_file=server.key, **flags
    )
    m = start_member(cfg)
    m.wait_leader()
    return m


def test_https_answers_with_the_ca_and_refuses_plaintext(tmp_path, pki, start_member):
    m = _tls_member(start_member, tmp_path, pki)
    with Client(m.url, ca_file=pki.ca_file, **FAST) as c:
        rev = c.put("k", "v").header.revision
        assert c.get("k").value == b"v"
    plain_url = m.url.replace("https://", "http://")
    with Client(plain_url, **FAST) as c, pytest.raises(ConnectionFailedError):
        c.put("k", "plaintext")
    # An https client that does not trust the CA: the handshake fails, it says why.
    with Client(m.url, **FAST) as c, pytest.raises(ConnectionFailedError, match="TLS handshake"):
        c.put("k", "untrusted")
    assert m.revision() == rev  # nothing of the refused attempts was applied
    with Client(m.url, ca_file=pki.ca_file, **FAST) as c:  # and the member still serves
        assert c.get("k").value == b"v"


def test_an_https_client_to_a_plaintext_port_fails_cleanly(tmp_path, pki, start_member):
    (cfg,) = cluster_configs(tmp_path)
    m = start_member(cfg)
    m.wait_leader()
    tls_url = m.url.replace("http://", "https://")
    with Client(tls_url, ca_file=pki.ca_file, **FAST) as c, pytest.raises(ConnectionFailedError):
        c.put("k", "v")
    with Client(m.url, **FAST) as c:
        assert c.put("k", "v").header.revision == 2  # first write: nothing before it


def _handshake_then_request(url: str, ctx: ssl.SSLContext) -> bytes:
    """Raw TLS: handshake, send one request, read; the refusal of a client certificate
    arrives as an alert at the first read under TLS 1.3 (at the handshake under 1.2)."""
    host, port = url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(
            b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n"
            b'{"key":"YQ==","value":"Yg=="}'
        )
        return tls.recv(100)


@pytest.mark.parametrize("who", ["no-cert", "other-ca", "expired"])
def test_client_cert_auth_refuses_bad_certificates_at_the_handshake(
    tmp_path, pki, other_pki, start_member, who
):
    m = _tls_member(start_member, tmp_path, pki, trusted_ca_file=pki.ca_file, client_cert_auth=True)
    good = pki.pair("client", common_name="alice")
    with Client(m.url, ca_file=pki.ca_file, cert_file=good.cert, key_file=good.key, **FAST) as c:
        rev = c.put("k", "v").header.revision
    bad = {
        "no-cert": None,
        "other-ca": other_pki.pair("mallory"),
        "expired": pki.expired_pair("expired"),
    }[who]
    opts = {} if bad is None else {"cert_file": bad.cert, "key_file": bad.key}
    with (
        Client(m.url, ca_file=pki.ca_file, **opts, **FAST) as c,
        pytest.raises(ConnectionFailedError),
    ):
        c.put("k", "refused")
    # The same at the socket: the server's alert ends the connection before any HTTP answer.
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    if bad is not None:
        ctx.load_cert_chain(bad.cert, bad.key)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        got = _handshake_then_request(m.url, ctx)
        assert got == b"", got  # (an empty read is a closed connection: also a refusal)
        raise ssl.SSLError("closed without an answer")
    assert m.revision() == rev


def test_async_client_and_cli_with_cacert_cert_key(
    tmp_path, pki, start_member, capsys, monkeypatch
):
    m = _tls_member(start_member, tmp_path, pki, trusted_ca_file=pki.ca_file, client_cert_auth=True)
    good = pki.pair("client")

    async def use_async() -> bytes:
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        ctx.load_cert_chain(good.cert, good.key)
        async with AsyncClient(m.url, ssl_context=ctx, **FAST) as c:
            await c.put("async", "yes")
            return (await c.get("async")).value

    assert asyncio.run(use_async()) == b"yes"
    for var in ("RAFTKV_ENDPOINTS", "RAFTKV_CACERT", "RAFTKV_CERT", "RAFTKV_KEY"):
        monkeypatch.delenv(var, raising=False)
    tls = ["--cacert", pki.ca_file, "--cert", good.cert, "--key", good.key]
    assert cli_main(["put", "cli", "ok", "--endpoints", m.url, *tls]) == 0
    assert cli_main(["get", "cli", "--endpoints", m.url, "--json", *tls]) == 0
    assert '"value": "ok"' in capsys.readouterr().out
    # The environment twins, as etcdctl's ETCDCTL_CACERT/CERT/KEY.
    monkeypatch.setenv("RAFTKV_CACERT", pki.ca_file)
    monkeypatch.setenv("RAFTKV_CERT", good.cert)
    monkeypatch.setenv("RAFTKV_KEY", good.key)
    assert cli_main(["get", "cli", "--endpoints", m.url]) == 0
    monkeypatch.delenv("RAFTKV_CERT")
    monkeypatch.delenv("RAFTKV_KEY")
    capsys.readouterr()
    assert cli_main(["get", "cli", "--endpoints", m.url, "--timeout", "2"]) == 1  # no cert
    assert "Error:" in capsys.readouterr().err
    # Half a pair is bad usage, said before any connection.
    assert cli_main(["get", "cli", "--endpoints", m.url, "--cert", good.cert]) == 1
    assert "give both --cert and --key" in capsys.readouterr().err


def test_auto_tls_generates_a_self_signed_pair_once(tmp_path, start_member):
    (cfg,) = cluster_configs(
        tmp_path, client="https", peer="https", auto_tls=True, peer_auto_tls=True
    )
    m = start_member(cfg)
    m.wait_leader()
    fixtures = tmp_path / "t0" / "fixtures"
    for side in ("client", "peer"):
        assert (fixtures / side / "cert.pem").is_file()
        assert (fixtures / side / "key.pem").stat().st_mode & 0o077 == 0  # private
    # Auto-TLS encrypts but proves nothing: clients skip verification (etcd: same).
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with Client(m.url, ssl_context=ctx, **FAST) as c:
        assert c.put("k", "v").header.revision == 2
    before = (fixtures / "client" / "cert.pem").read_bytes()
    m.stop()
    again = start_member(cfg)  # a restart reuses the pair
    again.wait_leader()
    assert (fixtures / "client" / "cert.pem").read_bytes() == before


def test_bench_over_tls_with_a_client_certificate(tmp_path, pki, start_member):
    import json
    import os
    import subprocess
    import sys

    m = _tls_member(start_member, tmp_path, pki, trusted_ca_file=pki.ca_file, client_cert_auth=True)
    good = pki.pair("client")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTKV_")}
    base = [
        sys.executable,
        "-m",
        "kvserver.cli",
        "bench",
        "put",
        "--endpoints",
        m.url,
        "--total",
        "200",
        "--clients",
        "4",
        "--json",
        "--target-leader",
    ]
    run = subprocess.run(
        [*base, "--cacert", pki.ca_file, "--cert", good.cert, "--key", good.key],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["count"], result["errors"]) == (200, 0)
    assert m.revision() == 201  # every put applied, over TLS
    refused = subprocess.run(
        [*base[:-1], "--timeout", "2", "--cacert", pki.ca_file],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )  # no client certificate
    assert refused.returncode == 1
    assert m.revision() == 201


def test_snapshot_save_from_an_https_member_with_a_client_certificate(
    tmp_path, pki, start_member, capsys, monkeypatch
):
    m = _tls_member(start_member, tmp_path, pki, trusted_ca_file=pki.ca_file, client_cert_auth=True)
    good = pki.pair("client")
    with Client(m.url, ca_file=pki.ca_file, cert_file=good.cert, key_file=good.key, **FAST) as c:
        rev = c.put("backed/up", "yes").header.revision
    for var in ("RAFTKV_ENDPOINTS", "RAFTKV_CACERT", "RAFTKV_CERT", "RAFTKV_KEY"):
        monkeypatch.delenv(var, raising=False)
    dest = str(tmp_path / "backup.snap")
    tls = ["--cacert", pki.ca_file, "--cert", good.cert, "--key", good.key]
    assert cli_main(["snapshot", "save", dest, "--endpoints", m.url, "--json", *tls]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["revision"] == rev
    # Without the client certificate the member refuses the handshake: nothing is saved.
    assert (
        cli_main(
            [
                "snapshot",
                "save",
                str(tmp_path / "no.snap"),
                "--endpoints",
                m.url,
                "--cacert",
                pki.ca_file,
                "--timeout",
                "3",
            ]
        )
        == 1
    )
    assert "Error:" in capsys.readouterr().err
    assert not (tmp_path / "no.snap").exists()
