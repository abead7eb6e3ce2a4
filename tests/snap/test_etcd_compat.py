"""Real etcd compatibility: .snap files written by etcd v3.4 load with our Snapshotter.

etcd is started on loopback with ``--snapshot-count 100``, ~300 keys are written through its
JSON gateway so that it takes a few snapshots, then it is stopped and ``member/snap/*.snap``
is read. Beyond decoding with every CRC checked, re-saving what we read reproduces etcd's
files byte for byte, so the two implementations agree on the encoding in both directions.
(etcd's WAL is read by wal/'s tests; here ``load()`` ignores the WAL.)
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from snap import Snapshotter, read_snap
from snap.names import parse_snap_name
from tests.conftest import require_program

pytestmark = [pytest.mark.external, pytest.mark.slow]

KEYS_TO_WRITE = 300
READY_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout_s: float = 5.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.load(resp)


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _run_etcd_and_write_keys(etcd: str, data_dir: str, log_path: str) -> None:
    client, peer = _free_port(), _free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    args = [etcd, "--name", "compat", "--data-dir", data_dir,
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"compat={peer_url}", "--snapshot-count", "100"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # poll, bounded, until the gateway answers a write
            try:
                _post(f"{client_url}/v3/kv/put", {"key": _b64("ready"), "value": _b64("1")})
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert proc.poll() is None, f"etcd exited early; see {log_path}"
                assert time.monotonic() < deadline, f"etcd not ready; see {log_path}"
                time.sleep(0.05)
        for i in range(KEYS_TO_WRITE):
            _post(f"{client_url}/v3/kv/put",
                  {"key": _b64(f"/compat/key-{i:04d}"), "value": _b64(f"value {i} " * 8)})
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_snap_files_written_by_etcd_load_and_reencode_identically(tmp_path):
    etcd = require_program("etcd", "Debian package etcd-server")
    data_dir = str(tmp_path / "etcd")
    _run_etcd_and_write_keys(etcd, data_dir, str(tmp_path / "etcd.log"))

    etcd_snap_dir = os.path.join(data_dir, "member", "snap")
    snap_dir = str(tmp_path / "copy")
    shutil.copytree(etcd_snap_dir, snap_dir)  # work on a copy: loading may rename files
    etcd_files = sorted(n for n in os.listdir(snap_dir) if n.endswith(".snap"))
    assert len(etcd_files) >= 2, f"expected several snapshots, got {os.listdir(snap_dir)}"
    assert "db" in os.listdir(snap_dir)  # etcd's bolt file lives here too and is ignored

    snapper = Snapshotter(snap_dir)
    assert snapper.snap_names() == sorted(etcd_files, reverse=True)
    newest = snapper.load()
    newest_name = parse_snap_name(snapper.snap_names()[0])
    assert (newest.metadata.term, newest.metadata.index) == (newest_name.term,
                                                             newest_name.index)
    assert newest.metadata.index >= 200  # etcd snapshots every 100 applied entries
    assert len(newest.metadata.conf_state.voters) == 1 and newest.metadata.conf_state.voters[0]
    json.loads(newest.data)  # etcd 3.4 puts its v2 store, as JSON, in the snapshot data

    resaved = Snapshotter(tmp_path / "resaved")
    for name in etcd_files:
        original = os.path.join(snap_dir, name)
        snapshot = read_snap(original)
        with open(resaved.save_snap(snapshot), "rb") as ours, open(original, "rb") as theirs:
            assert ours.read() == theirs.read(), name
    assert not [n for n in os.listdir(snap_dir) if n.endswith(".broken")]
