"""Multi-process load generation, and the PySyncObj comparison server (real processes)."""

import base64
import json
import urllib.request

import pytest

from kvserver.bench.runner import run
from kvserver.bench.workloads import BenchOptions

pytest.importorskip("pysyncobj")

from benchmarks.systems import PySyncObjSystem  # noqa: E402


def post(url, path, body):
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def pysyncobj_cluster(tmp_path):
    with PySyncObjSystem(str(tmp_path)) as system:
        leader = system.wait_ready()
        yield system, leader


@pytest.mark.slow
def test_pysyncobj_kv_answers_put_and_range_like_etcd(pysyncobj_cluster):
    system, leader = pysyncobj_cluster
    follower = next(u for u in system.urls if u != leader)
    r1 = post(leader, "/v3/kv/put", {"key": b64("a/1"), "value": b64("one")})
    r2 = post(follower, "/v3/kv/put", {"key": b64("a/2"), "value": b64("two")})  # forwarded
    r3 = post(leader, "/v3/kv/put", {"key": b64("a/1"), "value": b64("uno")})
    revs = [int(r["header"]["revision"]) for r in (r1, r2, r3)]
    assert revs == sorted(revs) and len(set(revs)) == 3
    for url in system.urls:  # linearizable reads see every acknowledged write, on any node
        got = post(url, "/v3/kv/range", {"key": b64("a/1")})
        assert got["count"] == "1"
        kv = got["kvs"][0]
        assert base64.b64decode(kv["value"]) == b"uno"
        assert (kv["version"], kv["mod_revision"]) == ("2", str(revs[2]))
        assert kv["create_revision"] == str(revs[0])
        every = post(url, "/v3/kv/range", {"key": b64("a/"), "range_end": b64("a0")})
        assert [base64.b64decode(k["key"]) for k in every["kvs"]] == [b"a/1", b"a/2"]
    missing = post(leader, "/v3/kv/range", {"key": b64("nope"), "serializable": True})
    assert "kvs" not in missing and "count" not in missing
    st = post(leader, "/v3/maintenance/status", {})
    assert st["leader"] == st["header"]["member_id"]


@pytest.mark.slow
def test_two_load_processes_merge_into_one_result(pysyncobj_cluster):
    """--procs 2 against the PySyncObj server: totals split and merged exactly."""
    system, leader = pysyncobj_cluster
    r = run(
        BenchOptions(
            op="put",
            endpoints=system.urls,
            clients=4,
            procs=2,
            total=101,
            key_space_size=7,
            sequential_keys=True,
        ).validate()
    )
    assert (r.stats.count, r.stats.error_count) == (101, 0)
    got = post(leader, "/v3/kv/range", {"key": b64("0"), "range_end": b64(":")})
    assert got["count"] == "7"  # sequential keys over both processes covered the key space
