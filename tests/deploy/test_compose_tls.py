"""deploy/: the TLS profile (``deploy/up.sh up --tls``, here ``RAFTKV_TLS=1``) runs a working
three-member cluster with https client and peer URLs.

``deploy/up.sh`` makes the throwaway CA and member certificate (in a temporary
``RAFTKV_TLS_DIR`` instead of deploy/tls/), builds the image and starts the members with
``docker-compose.tls.yml`` over ``docker-compose.yml``; this checks that the image's
HEALTHCHECK (verifying with the CA) reports healthy, that a put through one member is read
back through every member over https with the CA (the members agreed on a leader over their
TLS peer links, which require a certificate of the CA), that the members advertise https
URLs, and that a plaintext client is not served on the TLS port. Skipped only when Docker,
Compose or a base image is missing (as tests/deploy/test_compose.py).
"""

import json
import os
import ssl
import urllib.error
import urllib.request

import pytest

from tests.deploy.compose import (
    APP_IMAGE,
    NOT_YET,
    POLL_S,
    SERVICES,
    base_image_env,
    compose_cluster,
    docker_command,
    http,
    remove_stale_projects,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.external, pytest.mark.timeout(1800)]


def test_tls_profile_put_get_over_https_with_the_ca(tmp_path):
    pytest.importorskip("cryptography")  # up.sh makes the certificates with it
    docker = docker_command()
    remove_stale_projects(docker)
    tls_dir = str(tmp_path / "tls")
    with compose_cluster(docker, APP_IMAGE, base_image_env(docker), tls_dir=tls_dir) as (c, _):
        assert sorted(os.listdir(tls_dir)) == [
            "ca.pem",
            "client-key.pem",
            "client.pem",
            "member-key.pem",
            "member.pem",
        ]
        ctx = c.ssl_context
        assert all(url.startswith("https://") for url in c.urls.values())
        for service in SERVICES:
            wait_for(
                lambda s=service: c.inspect(s, "{{.State.Health.Status}}") == "healthy",
                90,
                f"docker health of {service} (https, verified with the CA)",
                interval_s=POLL_S,
                ignore=NOT_YET,
            )
        leader = c.leader()
        first = c.urls[SERVICES[0]]
        code, body = http("PUT", f"{first}/v1/kv/tls-key", b"over-https", context=ctx)
        assert code == 200, body
        for service in SERVICES:
            code, body = http("GET", f"{c.urls[service]}/v1/kv/tls-key", context=ctx)
            assert (code, body) == (200, b"over-https"), service
        status = c.status(leader)
        assert status is not None
        peer_urls = [u for m in status["members"] for u in m["peer_urls"]]
        assert peer_urls and all(u.startswith("https://") for u in peer_urls), status
        # Without the CA the member's certificate is not trusted; plain http gets no answer.
        with pytest.raises(urllib.error.URLError) as caught:
            http("GET", f"{first}/health", context=ssl.create_default_context())
        assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)
        plain = first.replace("https://", "http://")
        with pytest.raises((OSError, urllib.error.URLError)):
            urllib.request.urlopen(plain + "/health", timeout=5).read()
        print(json.dumps(status)[:500])
