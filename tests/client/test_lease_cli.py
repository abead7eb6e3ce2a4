"""``raftkv lease grant|revoke|keep-alive|timetolive|list`` (kvserver.cli.lease) against the
in-process API over ``LocalKV`` (see ``test_leases``).

Pinned down: etcdctl's lines by default (IDs in 16-digit hex that parse back), one JSON
document with ``--json`` (one line per refresh for keep-alive); IDs taken in hex or decimal;
exit status 0 / 1 with a one-line ``Error: ...`` / 2 on bad usage; ``keep-alive`` prints each
refresh until Ctrl-C (exit 130, in-process and as a real process, even when this test run
inherited SIGINT as ignored: see ``tests.client.sigint``) or until the lease is lost (exit 1).
"""

from __future__ import annotations

import _thread
import io
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time

import pytest

from kvserver import cli
from kvserver.cli import lease as cli_lease
from kvserver.client import Client
from kvserver.client.leases import format_lease_id
from tests.client.fakeserver import dead_url
from tests.client.servers import Served
from tests.client.sigint import default_sigint, python_module

WAIT_S = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ID_RE = r"(?:0x)?[0-9a-f]{16}"


@pytest.fixture
def api():
    served = Served().start()
    yield served
    served.close()


def run(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def grant(api, ttl_s, lease_id=0):
    return api.loop_thread.run(api.kv.lease_grant(ttl_s, lease_id)).lease_id


def test_grant_prints_etcdctls_line_and_the_id_reads_back(api, capsys):
    ep = f"--endpoints={api.url}"
    status, out, err = run(capsys, "lease", "grant", "10", ep)
    assert status == 0 and err == ""
    m = re.fullmatch(rf"lease ({ID_RE}) granted with TTL\(10s\)\n", out)
    assert m, out
    printed = m.group(1)
    (lease_id,) = api.kv.lessor.leases().leases
    assert printed == format_lease_id(lease_id)
    status, out, _ = run(capsys, "lease", "timetolive", printed, ep)
    assert status == 0
    assert re.fullmatch(rf"lease {printed} granted with TTL\(10s\), remaining\(\d+s\)\n", out)


def test_grant_with_an_id_in_hex_or_decimal_and_json(api, capsys):
    ep = f"--endpoints={api.url}"
    assert run(capsys, "lease", "grant", "5", "--id", "694d5765fc71500b", ep) == (
        0,
        "lease 694d5765fc71500b granted with TTL(5s)\n",
        "",
    )
    status, out, _ = run(capsys, "lease", "grant", "7", "--id", "4660", "--json", ep)
    doc = json.loads(out)
    assert status == 0 and doc["id"] == 4660 and doc["id_hex"] == "0x0000000000001234"
    assert doc["ttl_s"] == 7 and doc["header"]["member_id"] == api.kv.member_id
    assert run(capsys, "lease", "grant", "5", "--id", "0x1234", ep)[0] == 1  # exists
    assert set(api.kv.lessor.leases().leases) == {0x694D5765FC71500B, 4660}


def test_put_takes_the_lease_id_as_lease_grant_prints_it(api, capsys):
    ep = f"--endpoints={api.url}"
    for flag in ([], ["--id", "2d4fa20f72773001"], ["--id", "4660"]):  # 4660 prints as 0x...
        status, out, _ = run(capsys, "lease", "grant", "30", *flag, ep)
        assert status == 0
        printed = re.fullmatch(rf"lease ({ID_RE}) granted with TTL\(30s\)\n", out).group(1)
        key = f"held/{printed}"
        assert run(capsys, "put", key, "v", "--lease", printed, ep)[0] == 0
        status, out, _ = run(capsys, "lease", "timetolive", printed, "--keys", "--json", ep)
        assert status == 0 and json.loads(out)["keys"] == [key]
    assert {format_lease_id(i) for i in api.kv.lessor.leases().leases} >= {
        "2d4fa20f72773001",
        "0x0000000000001234",
    }
    assert run(capsys, "put", "free", "v", "--lease", "0", ep)[0] == 0  # 0: no lease


@pytest.mark.parametrize("bad", ["zz", "-1", "0x8000000000000000", "1.5"])
def test_put_refuses_a_bad_lease_id(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["put", "k", "v", "--lease", bad])
    assert e.value.code == 2 and "lease id" in capsys.readouterr().err


def test_timetolive_with_keys_json_and_expired(api, capsys):
    ep = f"--endpoints={api.url}"
    lease_id = grant(api, 30, 0x694D5765FC71500B)
    with Client(api.url) as c:
        c.put("k1", "v", lease=lease_id)
        c.put(b"k\xff", "v", lease=lease_id)
    status, out, _ = run(capsys, "lease", "timetolive", "694d5765fc71500b", "--keys", ep)
    assert status == 0
    assert re.fullmatch(
        r"lease 694d5765fc71500b granted with TTL\(30s\), remaining\(\d+s\), "
        r"attached keys\(\[k1 k\\xff\]\)\n",
        out,
    ), out
    status, out, _ = run(
        capsys, "lease", "timetolive", "0x694d5765fc71500b", "--keys", "--json", ep
    )
    doc = json.loads(out)
    assert doc["granted_ttl_s"] == 30 and not doc["expired"] and 0 <= doc["ttl_s"] <= 30
    assert doc["keys"] == ["k1", {"key": "a/8=", "encoding": "base64"}]
    status, out, err = run(capsys, "lease", "timetolive", "0x77", ep)
    assert (status, out, err) == (1, "lease 0x0000000000000077 already expired\n", "")
    status, out, _ = run(capsys, "lease", "timetolive", "0x77", "--json", ep)
    assert status == 1 and json.loads(out)["expired"] is True


def test_list_and_revoke(api, capsys):
    ep = f"--endpoints={api.url}"
    assert run(capsys, "lease", "list", ep) == (0, "found 0 leases\n", "")
    a = grant(api, 30, 0xA1)
    b = grant(api, 60, 0xB2)
    status, out, _ = run(capsys, "lease", "list", ep)
    assert status == 0 and out.splitlines()[0] == "found 2 leases"
    assert sorted(out.splitlines()[1:]) == ["00000000000000a1", "00000000000000b2"]
    status, out, _ = run(capsys, "lease", "list", "--json", ep)
    doc = json.loads(out)
    assert sorted(doc["ids"]) == [a, b] and sorted(doc["ids_hex"]) == [
        "00000000000000a1",
        "00000000000000b2",
    ]
    assert run(capsys, "lease", "revoke", "a1", ep) == (0, "lease 00000000000000a1 revoked\n", "")
    status, out, _ = run(capsys, "lease", "revoke", str(b), "--json", ep)
    assert status == 0 and json.loads(out)["revoked"] is True and json.loads(out)["id"] == b
    assert len(api.kv.lessor) == 0
    status, out, err = run(capsys, "lease", "revoke", "a1", ep)
    assert status == 1 and out == ""
    assert err.startswith("Error: ") and "requested lease not found" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_keep_alive_once(api, capsys):
    ep = f"--endpoints={api.url}"
    grant(api, 20, 0xC3)
    assert run(capsys, "lease", "keep-alive", "c3", "--once", ep) == (
        0,
        "lease 00000000000000c3 keepalived with TTL(20)\n",
        "",
    )
    status, out, _ = run(capsys, "lease", "keepalive", "195", "--once", "--json", ep)
    assert status == 0 and json.loads(out) == {"id": 195, "id_hex": "00000000000000c3", "ttl_s": 20}
    status, out, err = run(capsys, "lease", "keep-alive", "0x99", "--once", ep)
    assert status == 1 and out == "" and "requested lease not found" in err


class InterruptAfter(io.StringIO):
    """stdout that does what Ctrl-C does once ``lines`` lines were written."""

    def __init__(self, lines: int, action=None) -> None:
        super().__init__()
        self.lines = lines
        self.action = action or _thread.interrupt_main

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.getvalue().count("\n") == self.lines:
            self.action()
        return n


def keep_alive_in_process_until_ctrl_c(api, lease_id: int) -> None:
    # TTL 2 (refreshed every ~0.67 s): a stall of over 1.3 s on a loaded machine, not of
    # 0.67 s, would lose the lease (TTL 1 did, once in 200 runs at load 20 on 2 cores).
    grant(api, 2, lease_id)
    name = format_lease_id(lease_id)
    args = cli.build_parser().parse_args(["lease", "keep-alive", name, "--endpoints", api.url])
    out, err = InterruptAfter(3), io.StringIO()
    with default_sigint():  # interrupt_main does nothing while SIGINT is ignored
        status = cli_lease.cmd_keep_alive(args, out=out, err=err)
    assert status == 130, (status, out.getvalue(), err.getvalue())
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3
    assert set(lines) == {f"lease {name} keepalived with TTL(2)"}
    assert api.kv.lessor.exists(lease_id)


def test_keep_alive_prints_each_refresh_until_ctrl_c(api):
    keep_alive_in_process_until_ctrl_c(api, 0xD4)


def test_keep_alive_exits_1_when_the_lease_is_lost(api):
    grant(api, 1, 0xE5)  # TTL 1: the next refresh comes ~0.33 s after the first

    def revoke() -> None:
        api.loop_thread.run(api.kv.lease_revoke(0xE5))

    args = cli.build_parser().parse_args(
        ["lease", "keep-alive", "e5", "--json", "--endpoints", api.url]
    )
    out, err = InterruptAfter(1, revoke), io.StringIO()
    assert cli_lease.cmd_keep_alive(args, out=out, err=err) == 1
    assert out.getvalue().splitlines() == ['{"id":229,"id_hex":"00000000000000e5","ttl_s":1}']
    assert err.getvalue().startswith("Error: ") and "lease not found" in err.getvalue()
    assert err.getvalue().count("\n") == 1


def keep_alive_process_until_ctrl_c(api, lease_id: int) -> None:
    grant(api, 2, lease_id)  # TTL 2: refreshed every ~0.67 s, 1.3 s to spare if one is late
    name = format_lease_id(lease_id)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAFTKV_ENDPOINTS", None)
    proc = subprocess.Popen(
        python_module("kvserver.cli", "lease", "keep-alive", name, "--endpoints", api.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        # The child may take longer than the TTL to start on a loaded machine: keep the lease
        # alive from here until its first refresh is printed.
        deadline = time.monotonic() + WAIT_S
        while lines.empty() and proc.poll() is None and time.monotonic() < deadline:
            api.loop_thread.run(api.kv.lease_keepalive(lease_id))
            time.sleep(0.1)
        for _ in range(3):  # the first refresh and two more
            line = lines.get(timeout=WAIT_S)
            assert line == f"lease {name} keepalived with TTL(2)\n", (
                line,
                proc.poll(),
                proc.stderr.read() if proc.poll() is not None else "",
            )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT_S) == 130
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_keep_alive_process_ctrl_c_exits_130(api):
    keep_alive_process_until_ctrl_c(api, 0xF6)


def test_ctrl_c_works_when_the_test_run_ignores_sigint(api):
    """As under ``make test &`` from a script: this process ignores SIGINT (inherited by a
    child it starts); Ctrl-C still stops the keep-alive, in-process and as a process."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        keep_alive_in_process_until_ctrl_c(api, 0xD5)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored afterwards
        keep_alive_process_until_ctrl_c(api, 0xF7)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    "argv",
    [
        ["lease", "grant"],
        ["lease", "grant", "-5"],
        ["lease", "grant", "ten"],
        ["lease", "grant", "5", "--id", "zz"],
        ["lease", "revoke", "0"],
        ["lease", "revoke", "-1"],
        ["lease", "revoke", "0x8000000000000000"],
        ["lease", "keep-alive"],
        ["lease", "timetolive", "nope"],
        ["lease"],
    ],
)
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_registered_in_raftkv_and_endpoints_from_the_environment(api, capsys, monkeypatch):
    monkeypatch.setenv("RAFTKV_ENDPOINTS", api.url)
    grant(api, 9, 0x1F)
    assert cli.main(["lease", "list"]) == 0
    assert capsys.readouterr().out == "found 1 lease\n000000000000001f\n"


def test_unreachable_cluster_is_a_one_line_error(capsys):
    status, out, err = run(capsys, "lease", "list", f"--endpoints={dead_url()}", "--timeout", "0.5")
    assert status == 1 and out == "" and err.startswith("Error: lease list: ")
    assert err.count("\n") == 1
