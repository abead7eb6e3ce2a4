"""A real single-member etcd (Debian's ``etcd-server``) on loopback, for compatibility tests.

``with etcd_process(tmp_dir) as etcd:`` starts etcd with its own data dir (or one restored
from a snapshot file, ``restore_from``) and free ports,
waits (bounded poll) until its JSON gateway answers a read (which changes nothing, so the
first write still gets revision 2), yields an ``EtcdProcess`` with
``url``, ``data_dir`` and ``log_path``, and stops it with SIGTERM (SIGKILL after 30 s), so
its files are complete when the block ends. Without etcd the test is skipped locally and
fails under ``RAFTKV_REQUIRE_EXTERNAL=1`` (see ``tests.conftest.require_program``).
"""

import base64
import contextlib
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from kvserver.localcluster.launcher import free_ports
from tests.conftest import ETCD_INSTALL, require_program
from tests.support.procs import stop_process

READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EtcdProcess:
    url: str
    data_dir: str
    log_path: str
    ssl_context: ssl.SSLContext | None = None  # for an https url

    def post(self, path: str, body: dict, timeout_s: float = 10.0) -> dict:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s, context=self.ssl_context) as resp:
            return json.load(resp)

    def put(self, key: str, value: str) -> dict:
        return self.post("/v3/kv/put", {"key": b64(key), "value": b64(value)})


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@contextlib.contextmanager
def etcd_process(
    root: str,
    name: str = "compat",
    snapshot_count: int | None = None,
    extra_args: tuple[str, ...] = (),
    client_scheme: str = "http",
    ssl_context: ssl.SSLContext | None = None,
    restore_from: str | None = None,
):
    """``extra_args`` go to etcd as they are (e.g. TLS flags: then ``client_scheme``
    "https" and ``ssl_context``, what the readiness poll and ``post`` connect with).
    ``restore_from``: a snapshot file; the data dir is first made from it with ``etcdctl
    snapshot restore`` (this member's name and peer URL), so etcd starts from its state."""
    binary = require_program("etcd", ETCD_INSTALL)
    client, peer = free_ports(2)
    url, peer_url = f"{client_scheme}://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    data_dir, log_path = os.path.join(root, "etcd"), os.path.join(root, "etcd.log")
    if restore_from is not None:
        subprocess.run(
            [
                require_program("etcdctl", ETCD_INSTALL),
                "snapshot",
                "restore",
                restore_from,
                "--data-dir",
                data_dir,
                "--name",
                name,
                "--initial-cluster",
                f"{name}={peer_url}",
                "--initial-advertise-peer-urls",
                peer_url,
            ],
            check=True,
            capture_output=True,
            timeout=300,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
        )
    args = [
        binary,
        "--name",
        name,
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        url,
        "--advertise-client-urls",
        url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        f"{name}={peer_url}",
    ]
    if snapshot_count is not None:
        args += ["--snapshot-count", str(snapshot_count)]
    args += list(extra_args)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    etcd = EtcdProcess(url, data_dir, log_path, ssl_context)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # bounded poll until the gateway answers
            try:
                etcd.post("/v3/kv/range", {"key": b64("ready")}, timeout_s=1.0)
                break
            except urllib.error.HTTPError:  # it answered (a restored etcd may want auth)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert proc.poll() is None, f"etcd exited early; see {log_path}"
                assert time.monotonic() < deadline, f"etcd not ready; see {log_path}"
                time.sleep(0.05)
        yield etcd
    finally:
        stop_process(proc, 30)
