"""Container health check: exit 0 when this member's ``GET /health`` answers 200, else 1.

The URL is ``RAFTKV_HEALTHCHECK_URL`` if set, else ``/health`` on the first of
``RAFTKV_LISTEN_CLIENT_URLS`` (a wildcard host is asked on loopback). An https URL is verified
with the CA file ``RAFTKV_HEALTHCHECK_CACERT`` (else ``RAFTKV_TRUSTED_CA_FILE``, else the
system CAs); ``RAFTKV_HEALTHCHECK_CERT``/``RAFTKV_HEALTHCHECK_KEY`` give a client certificate
for a member with ``--client-cert-auth``. Standard library only, so it runs with any Python
in the image.
"""

import os
import ssl
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit


def health_url(environ=os.environ) -> str:
    explicit = environ.get("RAFTKV_HEALTHCHECK_URL")
    if explicit:
        return explicit
    first = environ.get("RAFTKV_LISTEN_CLIENT_URLS", "http://127.0.0.1:2379").split(",")[0]
    parts = urlsplit(first.strip())
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    netloc = f"[{host}]:{parts.port}" if ":" in host else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme or "http", netloc, "/health", "", ""))


def tls_context(environ=os.environ) -> ssl.SSLContext | None:
    ca = environ.get("RAFTKV_HEALTHCHECK_CACERT") or environ.get("RAFTKV_TRUSTED_CA_FILE")
    cert = environ.get("RAFTKV_HEALTHCHECK_CERT")
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(cafile=ca or None)
    if cert:
        ctx.load_cert_chain(cert, environ.get("RAFTKV_HEALTHCHECK_KEY") or None)
    return ctx


def main() -> int:
    url = health_url()
    try:
        context = tls_context() if url.startswith("https:") else None
        with urllib.request.urlopen(url, timeout=2.5, context=context) as resp:
            ok = resp.status == 200
    except (OSError, urllib.error.URLError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    print(f"{url}: {'ok' if ok else 'unhealthy'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
