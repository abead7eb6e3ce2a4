"""The client library and CLI against a real etcd (3.4+) through its JSON gateway.

raftkv speaks etcd's gateway dialect, and the same client must work against
etcd — this pins the dialect to the reference, not to our own server or fake. One etcd
member on loopback ports in a temporary directory, started and stopped by the fixture.
"""

import json
import time

import pytest

from kvserver.cli import client as cli_client
from kvserver.client import (
    Client,
    Cmp,
    CompactedError,
    FutureRevisionError,
    InvalidArgumentError,
    NotFoundError,
    Op,
    Txn,
)
from tests.etcd_process import etcd_process

pytestmark = pytest.mark.external

START_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    with etcd_process(str(tmp_path_factory.mktemp("etcd")), name="e1") as proc:
        with Client(proc.url, timeout_s=1.0, retries=0) as probe:  # wait for a leader
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _has_leader(probe):
                assert time.monotonic() < deadline, f"etcd has no leader; see {proc.log_path}"
                time.sleep(0.1)
        yield proc.url


def _has_leader(client) -> bool:
    try:
        return bool(client.status().leader)
    except Exception:
        return False


def test_round_trip_against_etcd(etcd):
    with Client(etcd) as c:
        first = c.put("ext/a", "1")
        assert first.revision > 1 and first.header.member_id != 0
        second = c.put("ext/a", "2", prev_kv=True)
        assert second.revision == first.revision + 1
        assert second.prev_kv.value == b"1" and second.prev_kv.version == 1
        c.put("ext/b", "\u00e9")
        kv = c.get("ext/a")
        assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (
            b"2",
            2,
            first.revision,
            second.revision,
        )
        r = c.range("ext/", prefix=True, limit=1, sort_order="descend")
        assert [x.key for x in r.kvs] == [b"ext/b"] and r.more and r.count == 2
        assert c.range("ext/", prefix=True, count_only=True).kvs == ()
        assert c.range("ext/", prefix=True, keys_only=True).kvs[0].value == b""
        assert c.range("ext/", prefix=True, serializable=True).count == 2

        t = c.txn(
            Txn()
            .when(Cmp.version("ext/lock") == 0, Cmp.value("ext/a") == "2")
            .then(Op.put("ext/lock", "me"), Op.get("ext/", prefix=True))
            .otherwise(Op.get("ext/lock"))
        )
        assert t.succeeded and t.responses[1].count == 3
        t = c.txn(
            Txn()
            .when(Cmp.version("ext/lock") == 0)
            .then(Op.put("ext/lock", "you"))
            .otherwise(Op.get("ext/lock"))
        )
        assert not t.succeeded and t.responses[0].kvs[0].value == b"me"

        d = c.delete("ext/", prefix=True, prev_kv=True)
        assert d.deleted == 3 and len(d.prev_kvs) == 3

        c.compact(first.revision)
        with pytest.raises(CompactedError):
            c.range("ext/a", revision=first.revision - 1)
        with pytest.raises(FutureRevisionError):
            c.range("ext/a", revision=d.revision + 100)
        with pytest.raises(InvalidArgumentError, match="key is not provided"):
            c.put("", "x")
        with pytest.raises(NotFoundError, match="lease not found"):
            c.put("ext/l", "x", lease=12345)

        status = c.status()
        assert status.is_leader and status.raft_index >= status.raft_applied_index > 0
        assert status.version.startswith("3.")
        members = c.member_list()
        assert len(members) == 1 and members[0].client_urls == (etcd,)
        assert c.find_leader() == etcd


def test_cli_against_etcd(etcd, capsys):
    ep = f"--endpoints={etcd}"
    assert cli_client.main(["put", "ext/cli", "v", ep]) == 0
    assert cli_client.main(["get", "ext/cli", "--json", ep]) == 0
    assert cli_client.main(["status", ep]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert doc["kvs"][0]["value"] == "v"
    assert "| true      |" in out  # the single member is the leader
