"""Archive lag in the member's status and in ``raftkv status``.

Fast: the two status documents carry the lag only when the member archives (etcd's
``/v3/maintenance/status`` as an extra ``raftkvArchive`` field that etcd clients ignore),
the client decodes it, and ``raftkv status`` shows the two columns only then.
Slow: a real member with ``--archive-url`` reports it on both endpoints and in the table; a
member without it does not.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from kvserver.api.http.gateway_json import status_response
from kvserver.api.http.ops import status_json
from kvserver.cli.client import render_status
from kvserver.client import codec
from kvserver.client.types import EndpointStatus
from kvserver.server.service import NodeStatus
from tests.archive.helpers import cli


def _node_status(**kw) -> NodeStatus:
    return NodeStatus(
        member_id=0x8E9E05C52164694D,
        cluster_id=0xCDF818194E3A8C32,
        name="n1",
        leader=0x8E9E05C52164694D,
        raft_term=2,
        raft_index=17,
        raft_applied_index=17,
        revision=8,
        compact_revision=0,
        db_size_bytes=4096,
        is_learner=False,
        **kw,
    )


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _roundtrip(s: NodeStatus):
    doc = json.loads(json.dumps(status_response(s)))
    return codec.decode_status(doc, "http://e1")


def test_status_documents_carry_the_lag_only_when_archiving():
    off, on = _node_status(), _node_status(archive_lag_entries=42, archive_lag_seconds=1.25)
    assert "archive" not in status_json(off) and "raftkvArchive" not in status_response(off)
    assert status_json(on)["archive"] == {"lag_entries": 42, "lag_seconds": 1.25}
    assert status_response(on)["raftkvArchive"] == {"lagEntries": "42", "lagSeconds": 1.25}
    got = _roundtrip(on)
    assert (got.archive_lag_entries, got.archive_lag_seconds) == (42, 1.25)
    got = _roundtrip(off)
    assert (got.archive_lag_entries, got.archive_lag_seconds) == (None, None)
    assert (got.raft_index, got.revision) == (17, 8)  # the etcd fields are untouched


def test_status_table_shows_archive_columns_only_when_a_member_archives():
    off = EndpointStatus("http://e1", _roundtrip(_node_status()), None)
    on = EndpointStatus(
        "http://e2", _roundtrip(_node_status(archive_lag_entries=7, archive_lag_seconds=0.5)), None
    )
    plain = render_status([off], as_json=False)
    assert "ARCHIVE" not in plain
    lines = render_status([off, on], as_json=False).splitlines()
    head = _cells(next(ln for ln in lines if "ENDPOINT" in ln))
    assert head[-3:] == ["ARCHIVE LAG", "ARCHIVE LAG TIME", "ERRORS"]
    assert _cells(next(ln for ln in lines if "http://e2" in ln))[-3:-1] == ["7", "0.5s"]
    assert _cells(next(ln for ln in lines if "http://e1" in ln))[-3:-1] == ["-", "-"]
    docs = json.loads(render_status([off, on], as_json=True))
    assert "archive_lag_entries" not in docs[0]
    assert (docs[1]["archive_lag_entries"], docs[1]["archive_lag_seconds"]) == (7, 0.5)


@pytest.mark.slow
def test_real_member_reports_archive_lag(make_cluster, tmp_path):
    c = make_cluster(
        1, extra_args=["--archive-url", f"file://{tmp_path}/archive", "--archive-interval", "100"]
    )
    plain = make_cluster(1)
    url = c.endpoints[0]
    with urllib.request.urlopen(url + "/v1/status", timeout=10) as r:
        doc = json.loads(r.read())
    assert set(doc["archive"]) == {"lag_entries", "lag_seconds"}
    assert doc["archive"]["lag_entries"] >= 0
    req = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert "lagEntries" in json.loads(r.read())["raftkvArchive"]
    r = cli("status", "--endpoints", url)
    assert r.returncode == 0, r.stderr
    assert "ARCHIVE LAG" in r.stdout
    r = cli("status", "--endpoints", plain.endpoints[0])
    assert r.returncode == 0, r.stderr
    assert "ARCHIVE" not in r.stdout
    with urllib.request.urlopen(plain.endpoints[0] + "/v1/status", timeout=10) as resp:
        assert "archive" not in json.loads(resp.read())
