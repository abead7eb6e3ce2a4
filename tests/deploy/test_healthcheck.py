"""deploy/healthcheck.py, the image's HEALTHCHECK: which URL it asks and what it answers.

Fast tests (no Docker): the URL comes from the member's own listen URL (a wildcard host is
asked on loopback), ``RAFTKV_HEALTHCHECK_URL`` overrides it, and the exit status is 0 only for
a 200 from ``/health``.
"""

import http.server
import importlib.util
import os
import threading

import pytest

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "healthcheck.py")
spec = importlib.util.spec_from_file_location("raftkv_deploy_healthcheck", PATH)
healthcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(healthcheck)


@pytest.mark.parametrize(
    "listen, expected",
    [
        ("http://0.0.0.0:2379", "http://127.0.0.1:2379/health"),
        ("http://0.0.0.0:3379,http://10.0.0.5:4379", "http://127.0.0.1:3379/health"),
        ("http://[::]:2379", "http://127.0.0.1:2379/health"),
        ("http://10.1.2.3:2379/", "http://10.1.2.3:2379/health"),
        ("https://[fd00::1]:2379", "https://[fd00::1]:2379/health"),
    ],
)
def test_url_is_health_on_the_first_listen_url(listen, expected):
    assert healthcheck.health_url({"RAFTKV_LISTEN_CLIENT_URLS": listen}) == expected


def test_url_defaults_and_override():
    assert healthcheck.health_url({}) == "http://127.0.0.1:2379/health"
    env = {
        "RAFTKV_LISTEN_CLIENT_URLS": "http://0.0.0.0:2379",
        "RAFTKV_HEALTHCHECK_URL": "http://127.0.0.1:9/health",
    }
    assert healthcheck.health_url(env) == "http://127.0.0.1:9/health"


@pytest.fixture
def health_server():
    """A loopback server whose /health answers with ``state['status']``."""
    state = {"status": 200, "paths": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["paths"].append(self.path)
            self.send_response(state["status"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("status, exit_code", [(200, 0), (503, 1), (500, 1)])
def test_exit_status_follows_health(health_server, monkeypatch, status, exit_code):
    state, port = health_server
    state["status"] = status
    monkeypatch.setenv("RAFTKV_LISTEN_CLIENT_URLS", f"http://0.0.0.0:{port}")
    monkeypatch.delenv("RAFTKV_HEALTHCHECK_URL", raising=False)
    assert healthcheck.main() == exit_code
    assert state["paths"] == ["/health"]


def test_nothing_listening_is_unhealthy(monkeypatch):
    from kvserver.localcluster.launcher import free_ports

    monkeypatch.setenv("RAFTKV_HEALTHCHECK_URL", f"http://127.0.0.1:{free_ports(1)[0]}/health")
    assert healthcheck.main() == 1


def test_https_is_verified_with_the_healthcheck_ca(monkeypatch, tmp_path):
    """The TLS profile: the member's certificate is trusted only through
    ``RAFTKV_HEALTHCHECK_CACERT`` (or ``RAFTKV_TRUSTED_CA_FILE``), not the system CAs."""
    import ssl

    pytest.importorskip("cryptography")
    from kvserver.tls import make_cluster_pki

    pki = make_cluster_pki(str(tmp_path / "tls"), ["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    handler = type(
        "H",
        (http.server.BaseHTTPRequestHandler,),
        {
            "do_GET": lambda self: (self.send_response(200), self.end_headers()),
            "log_message": lambda self, *a: None,
        },
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/health"
        monkeypatch.setenv("RAFTKV_HEALTHCHECK_URL", url)
        for name in (
            "RAFTKV_HEALTHCHECK_CACERT",
            "RAFTKV_TRUSTED_CA_FILE",
            "RAFTKV_HEALTHCHECK_CERT",
        ):
            monkeypatch.delenv(name, raising=False)
        assert healthcheck.main() == 1  # unknown CA: refused
        monkeypatch.setenv("RAFTKV_HEALTHCHECK_CACERT", pki.ca_file)
        assert healthcheck.main() == 0
        monkeypatch.delenv("RAFTKV_HEALTHCHECK_CACERT")
        monkeypatch.setenv("RAFTKV_TRUSTED_CA_FILE", pki.ca_file)
        assert healthcheck.main() == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
