"""``https://`` URLs are refused unless TLS is configured.

Otherwise ``raftkv serve --listen-client-urls https://...`` would log "serving clients on
https://..." and answer plain HTTP: a client believing its traffic was encrypted sent it in
clear text. etcd refuses to start when the cert flags are missing ("TLS key/cert (--cert-file,
--key-file) must be provided for client url ... with HTTPS scheme"); so does raftkv, for every
client and peer URL it listens on or advertises, through one check
(``kvserver.server.config.check_url_schemes``; ``tls_configured`` says yes for a certificate and key
pair or auto-TLS: tests/tls covers the configured side).
"""

import argparse
import os
import subprocess
import sys

import pytest

from kvserver.localcluster.launcher import free_ports
from kvserver.membership.identity import ClusterConfigError
from kvserver.server.config import (
    ServerConfig,
    add_server_flags,
    check_url_schemes,
    config_from_args,
)


def _cfg(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    return config_from_args(parser.parse_args(list(argv)), {})


def _flags(client: str = "http", peer: str = "http", **override) -> list[str]:
    c, p = f"{client}://127.0.0.1:2379", f"{peer}://127.0.0.1:2380"
    flags = {
        "--listen-client-urls": c,
        "--advertise-client-urls": c,
        "--listen-peer-urls": p,
        "--initial-advertise-peer-urls": p,
        "--initial-cluster": f"n1={p}",
        "--name": "n1",
        **override,
    }
    return [x for kv in flags.items() for x in kv]


def test_plain_http_urls_pass():
    cfg = _cfg(*_flags())
    check_url_schemes(cfg)  # and again on the built config: still fine
    assert cfg.listen_client_urls == ("http://127.0.0.1:2379",)


@pytest.mark.parametrize(
    "flag, url, kind",
    [
        ("--listen-client-urls", "https://127.0.0.1:2379", "client"),
        ("--advertise-client-urls", "https://10.0.0.1:2379", "client"),
        ("--listen-peer-urls", "https://127.0.0.1:2380", "peer"),
    ],
)
def test_one_https_url_is_refused_naming_flag_url_and_cert_flags(flag, url, kind):
    with pytest.raises(ClusterConfigError) as info:
        _cfg(*_flags(**{flag: url}))
    message = str(info.value)
    assert message.startswith(f"{flag} {url}:")
    assert (
        "--cert-file and --key-file" if kind == "client" else "--peer-cert-file and --peer-key-file"
    ) in message
    assert "plain HTTP" in message


def test_https_advertised_peer_url_is_refused():
    # --initial-advertise-peer-urls must match the member's --initial-cluster entry, so both
    # say https here; the first checked names the advertised URL.
    with pytest.raises(ClusterConfigError, match="--initial-advertise-peer-urls https://"):
        _cfg(*_flags(peer="https", **{"--listen-peer-urls": "http://127.0.0.1:2380"}))


def test_https_url_of_another_member_is_refused():
    with pytest.raises(ClusterConfigError, match="--initial-cluster https://127.0.0.1:3380"):
        _cfg(*_flags(**{"--initial-cluster": "n1=http://127.0.0.1:2380,n2=https://127.0.0.1:3380"}))


def test_a_config_built_in_code_is_checked_too():
    cfg = ServerConfig(listen_client_urls=("https://127.0.0.1:2379",))
    with pytest.raises(ClusterConfigError, match="--listen-client-urls"):
        check_url_schemes(cfg)


def test_serve_with_an_https_client_url_exits_2_with_the_message(tmp_path):
    client, peer = free_ports(2)
    url = f"https://127.0.0.1:{client}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvserver.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen-client-urls",
            url,
            "--advertise-client-urls",
            url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAFTKV_")},
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        f"--listen-client-urls {url}: TLS key/cert (--cert-file and --key-file (or "
        f"--auto-tls)) must be provided for client url {url} with HTTPS scheme" in proc.stderr
    )
    assert "serving clients" not in proc.stdout + proc.stderr
    assert not (tmp_path / "d").exists()  # refused before touching the data dir
