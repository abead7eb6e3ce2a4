"""``raftkv watch`` (``kvserver.cli.watch``) as a real process against raftkv's HTTP API over
``LocalKV``: lines as events happen (human and ``--json``), ``--prefix``/``--rev``/
``--prev-kv``, Ctrl-C exits 130 without a traceback (also when this test run inherited SIGINT
as ignored: see ``tests.client.sigint``), a compacted start revision exits 1 with
the compact revision, and the rendering functions on their own."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading

import pytest

from kvserver import cli
from kvserver.cli.watch import render_event
from kvserver.client import EventType, KeyValue, WatchEvent
from kvserver.kvpb.kv import CompactionRequest, DeleteRangeRequest
from tests.client.servers import Replicas
from tests.client.sigint import python_module

WAIT_S = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WatchProcess:
    def __init__(self, url: str, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("RAFTKV_ENDPOINTS", None)
        self.proc = subprocess.Popen(
            python_module("kvserver.cli", "watch", "--endpoints", url, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self) -> str:
        line = self.lines.get(timeout=WAIT_S)
        assert line is not None, f"watch exited: {self.proc.wait(WAIT_S)} {self.proc.stderr.read()}"
        return line.rstrip("\n")

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(WAIT_S)
        return code, self.proc.stderr.read()

    def wait(self) -> tuple[int, str]:
        code = self.proc.wait(WAIT_S)
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def server():
    r = Replicas(1).start()
    yield r
    r.close()


def test_prints_history_then_live_events_and_ctrl_c_exits_130(server):
    server.put("jobs/1", "queued")  # 2
    server.put("other", "x")  # 3
    w = WatchProcess(server.urls[0], "jobs/", "--prefix", "--rev", "1", "--prev-kv")
    try:
        assert w.line() == "PUT jobs/1 = queued (revision 2)"
        server.put("jobs/1", "running")  # 4
        assert w.line() == "PUT jobs/1 = running (revision 4; was queued)"
        server.write(DeleteRangeRequest(b"jobs/1"))  # 5
        assert w.line() == "DELETE jobs/1 (revision 5; was running)"
        code, stderr = w.interrupt()
        assert code == 130
        assert "Traceback" not in stderr
    finally:
        w.kill()


def test_json_lines(server):
    server.put("k", "v1")
    server.put("k", "v\u00e9")
    w = WatchProcess(server.urls[0], "k", "--rev", "2", "--json")
    try:
        first, second = json.loads(w.line()), json.loads(w.line())
        assert first == {
            "type": "PUT",
            "revision": 2,
            "prev_kv": None,
            "kv": {
                "key": "k",
                "value": "v1",
                "create_revision": 2,
                "mod_revision": 2,
                "version": 1,
                "lease": 0,
            },
        }
        assert second["kv"]["value"] == "v\u00e9" and second["revision"] == 3
        assert w.interrupt()[0] == 130
    finally:
        w.kill()


def test_compacted_start_revision_exits_1_naming_the_compact_revision(server):
    for i in range(4):
        server.put("k", str(i))  # 2..5
    server.write(CompactionRequest(4))
    w = WatchProcess(server.urls[0], "k", "--rev", "2")
    try:
        code, stderr = w.wait()
        assert code == 1
        assert stderr.startswith("Error: ") and "compact revision 4" in stderr
        assert "Traceback" not in stderr
    finally:
        w.kill()


def test_unreachable_endpoint_is_an_error_not_a_traceback(capsys):
    from kvserver.localcluster.launcher import free_ports

    (port,) = free_ports(1)
    # 2 s: on a loaded machine an attempt that has not yet been refused when a shorter
    # deadline passes leaves no "connection refused" to report
    code = cli.main(["watch", "k", "--endpoints", f"http://127.0.0.1:{port}", "--timeout", "2"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "Traceback" not in err
    assert "could not reach any endpoint" in err and "connection refused" in err


def test_render_event():
    kv = KeyValue(b"a", b"1", create_revision=2, mod_revision=3, version=2)
    prev = KeyValue(b"a", b"0", create_revision=2, mod_revision=2, version=1)
    put = WatchEvent(EventType.PUT, kv, prev)
    assert render_event(put, as_json=False) == "PUT a = 1 (revision 3; was 0)\n"
    tomb = WatchEvent(EventType.DELETE, KeyValue(b"a\n", b"", mod_revision=4))
    assert render_event(tomb, as_json=False) == "DELETE a\\n (revision 4)\n"
    doc = json.loads(
        render_event(
            WatchEvent(EventType.PUT, KeyValue(b"\xff", b"x", mod_revision=5)), as_json=True
        )
    )
    assert doc["kv"]["encoding"] == "base64" and doc["kv"]["key"] == "/w=="
