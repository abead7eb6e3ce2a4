"""The ``etcd3gw`` client (PyPI, used unmodified) against raftkv and against a real etcd.

An existing etcd v3 JSON-gateway client works against raftkv
unchanged. Every test body runs twice (``backend`` fixture): against a three-node raftkv of
real ``raftkv serve`` processes and against a real etcd 3.4 — the etcd run proves the test
checks what etcd really does. etcd3gw talks to one endpoint; lease keep-alive and
time-to-live sent to a follower are forwarded to the leader, by etcd and by raftkv
(``test_lease_keepalive_through_a_follower``).

Waits poll with deadlines; lease expiry is asserted with a deadline of TTL + one election
timeout + slack, never as a timing equality.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("etcd3gw")

from etcd3gw import exceptions  # noqa: E402

from tests.support.wait import wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.external]

EXPIRY_SLACK_S = 5.0  # scheduling noise on a shared two-core machine


def _b(text: str) -> bytes:
    return text.encode()


def test_put_get_get_prefix_delete(backend):
    c = backend.client(backend.follower_url())  # plain KV works through any member
    assert c.put("kv/a", "1") is True
    assert c.put("kv/b", "2") is True
    assert c.put("kv/c/d", "3") is True
    assert c.put("kx", "outside") is True
    assert c.get("kv/a") == [b"1"]
    assert c.get("kv/missing") == []
    got = c.get_prefix("kv/")
    assert [(meta["key"], value) for value, meta in got] == [
        (b"kv/a", b"1"),
        (b"kv/b", b"2"),
        (b"kv/c/d", b"3"),
    ]
    value, meta = c.get("kv/a", metadata=True)[0]
    assert value == b"1" and meta["version"] == "1"
    assert int(meta["create_revision"]) == int(meta["mod_revision"]) > 1
    c.put("kv/a", "1b")
    value, meta = c.get("kv/a", metadata=True)[0]
    assert value == b"1b" and meta["version"] == "2"
    assert int(meta["mod_revision"]) > int(meta["create_revision"])
    # sort through etcd3gw's own parameters
    desc = c.get_prefix("kv/", sort_order="descend", sort_target="key")
    assert [meta["key"] for _, meta in desc] == [b"kv/c/d", b"kv/b", b"kv/a"]
    assert c.get("kv/", range_end="kv0", limit=1) == [b"1b"]
    assert c.delete("kv/a") is True
    assert c.delete("kv/a") is False  # nothing deleted: no "deleted" field
    assert c.get("kv/a") == []
    assert c.delete_prefix("kv/") is True
    assert c.get_prefix("kv/") == []
    assert c.get("kx") == [b"outside"]
    # binary keys and values round-trip through base64
    c.put(b"kv/\x00\xff", b"\x01\x02")
    assert c.get(b"kv/\x00\xff") == [b"\x01\x02"]


def test_transaction_compare_success_failure(backend):
    c = backend.client(backend.follower_url())
    key = "txn/k"
    enc = base64.b64encode
    k64 = enc(_b(key)).decode()
    assert c.create(key, "v1") is True
    assert c.create(key, "other") is False  # exists: CREATE == 0 fails
    assert c.replace(key, "v1", "v2") is True
    assert c.replace(key, "v1", "v3") is False
    assert c.get(key) == [b"v2"]
    txn = {
        "compare": [
            {"key": k64, "result": "EQUAL", "target": "VALUE", "value": enc(b"v2").decode()},
            {"key": k64, "result": "GREATER", "target": "VERSION", "version": 1},
        ],
        "success": [
            {"request_put": {"key": k64, "value": enc(b"v3").decode()}},
            {"request_range": {"key": k64}},
        ],
        "failure": [{"request_range": {"key": k64}}],
    }
    result = c.transaction(txn)
    assert result["succeeded"] is True
    put_resp, range_resp = result["responses"]
    assert set(put_resp) == {"response_put"} and set(range_resp) == {"response_range"}
    kv = range_resp["response_range"]["kvs"][0]
    assert enc(b"v3").decode() == kv["value"] and kv["version"] == "3"
    # the same compare now fails: the failure branch runs, "succeeded" is omitted
    result = c.transaction(txn)
    assert "succeeded" not in result
    assert result["responses"][0]["response_range"]["kvs"][0]["value"] == kv["value"]
    # a txn that breaks etcd's rules is refused with 400 (etcd3gw: Etcd3Exception)
    with pytest.raises(exceptions.Etcd3Exception) as err:
        c.transaction({"success": [{"request_put": {"key": k64}}, {"request_put": {"key": k64}}]})
    assert "duplicate key given in txn request" in err.value.detail_text


def test_lease_grant_refresh_revoke_with_attached_keys(backend):
    c = backend.client(backend.leader_url())
    lease = c.lease(ttl=30)
    assert lease.id > 0
    assert c.put("lease/a", "1", lease=lease) is True
    assert c.put("lease/b", "2", lease=lease) is True
    assert c.put("lease/c", "3") is True
    assert sorted(lease.keys()) == [b"lease/a", b"lease/b"]
    assert 0 < lease.ttl() <= 30
    assert lease.refresh() == 30
    _, meta = c.get("lease/a", metadata=True)[0]
    assert int(meta["lease"]) == lease.id
    assert lease.revoke() is True
    assert c.get_prefix("lease/") and [m["key"] for _, m in c.get_prefix("lease/")] == [b"lease/c"]
    assert lease.ttl() == -1  # etcd: TTL -1 for a lease that is gone
    assert lease.refresh() == -1  # etcd: no TTL in the keep-alive answer
    with pytest.raises(exceptions.Etcd3Exception) as err:
        lease.revoke()  # etcd: 404 requested lease not found
    assert "requested lease not found" in err.value.detail_text
    with pytest.raises(exceptions.Etcd3Exception):
        c.put("lease/d", "4", lease=lease)  # a put naming an unknown lease
    assert c.get("lease/d") == []


def test_lease_expires_without_refresh_and_deletes_its_keys(backend):
    c = backend.client(backend.leader_url())
    lease = c.lease(ttl=2)
    c.put("exp/a", "1", lease=lease)
    granted = time.monotonic()
    deadline_s = 2 + backend.election_timeout_s + EXPIRY_SLACK_S
    wait_for(lambda: c.get("exp/a") == [], deadline_s, "the leased key to be deleted")
    assert time.monotonic() - granted >= 1.0  # not deleted right away (TTL >= 2 s)
    assert lease.ttl() == -1


def test_lock_two_contenders_release_and_expiry(backend):
    c = backend.client(backend.leader_url())
    first = c.lock("job-42", ttl=3)
    second = c.lock("job-42", ttl=3)
    assert first.acquire() is True
    assert second.acquire() is False  # held: the second contender fails
    assert first.is_acquired() and not second.is_acquired()
    assert first.release() is True
    assert not first.is_acquired()
    assert second.release() is False  # not the holder: nothing deleted
    assert second.acquire() is True  # free again: the second one gets it
    assert second.is_acquired()
    assert first.release() is False
    assert second.release() is True

    # Expiry: the holder refreshes past its TTL and keeps the lock; then it stops and
    # another contender gets the lock within TTL + an election timeout (+ slack).
    holder, waiter = c.lock("job-43", ttl=3), c.lock("job-43", ttl=3)
    assert holder.acquire() is True
    start = time.monotonic()
    while time.monotonic() - start < 4.5:  # 1.5 x TTL, refreshed every 0.5 s
        assert holder.refresh() == 3
        time.sleep(0.5)
    assert holder.is_acquired() and waiter.acquire() is False
    stopped = time.monotonic()
    wait_for(
        waiter.acquire,
        3 + backend.election_timeout_s + EXPIRY_SLACK_S,
        "the lock to be free after the holder stopped refreshing",
        interval_s=0.2,
    )
    assert time.monotonic() - stopped > 1.0  # the lease outlived its last refresh
    assert waiter.is_acquired() and not holder.is_acquired()
    assert waiter.release() is True


def test_status_and_version(backend):
    c = backend.client(backend.follower_url())
    status = c.status()
    assert set(status) >= {"header", "version", "dbSize", "leader", "raftIndex", "raftTerm"}
    assert int(status["header"]["revision"]) >= 1
    assert c.api_path == "/v3/"  # discovered from GET /version


def _watch_answers_501(url: str) -> bool:
    req = urllib.request.Request(
        url + "/v3/watch",
        data=json.dumps({"create_request": {"key": "AA=="}}).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status == 501
    except urllib.error.HTTPError as exc:
        return exc.code == 501
    except OSError:
        return False  # a stream that stays open (timed out reading): served


def test_watch_prefix_sees_puts_and_deletes_in_order(backend):
    c = backend.client(backend.follower_url())
    assert not _watch_answers_501(backend.follower_url()), "/v3/watch answers 501"
    start = int(c.status()["header"]["revision"]) + 1
    events, cancel = c.watch_prefix("w/", start_revision=start)
    seen: list[dict] = []

    def consume() -> None:
        for ev in events:
            seen.append(ev)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        c.put("w/a", "1")
        c.put("other", "x")
        c.put("w/b", "2")
        c.put("w/a", "3")
        c.delete("w/a")
        wait_for(lambda: len(seen) >= 4, 10, "four watch events")
        got = [(ev.get("type", "PUT"), ev["kv"]["key"], ev["kv"].get("value", b"")) for ev in seen]
        assert got == [
            ("PUT", b"w/a", b"1"),
            ("PUT", b"w/b", b"2"),
            ("PUT", b"w/a", b"3"),
            ("DELETE", b"w/a", b""),
        ]
        revs = [int(ev["kv"]["mod_revision"]) for ev in seen]
        assert revs == sorted(revs) and len(set(revs)) == 4
    finally:
        cancel()
        reader.join(timeout=5)


def test_lease_keepalive_through_a_follower(backend):
    """etcd forwards LeaseKeepAlive/TimeToLive from a follower to the leader; so does
    raftkv, so a single-endpoint gateway client pointed at a follower keeps a lease alive.
    (raftkv forwards to the leader's client URL: wait until every member has published it.)"""
    lease = backend.client(backend.leader_url()).lease(ttl=30)
    c = backend.client(backend.follower_url())
    wait_for(
        lambda: all(m.get("clientURLs") for m in c.members()),
        10,
        "every member's client URLs in a follower's member list",
    )
    assert c.put("fl/a", "1", lease=c.lease(ttl=30)) is True
    from etcd3gw.lease import Lease

    assert Lease(lease.id, client=c).refresh() == 30
    assert 0 < Lease(lease.id, client=c).ttl() <= 30


def test_members_lists_every_member_with_its_urls(backend):
    c = backend.client(backend.follower_url())

    def complete():  # a member publishes its client URLs once it is up (etcd too): poll
        ms = c.members()
        return ms if all(m.get("clientURLs") for m in ms) else None

    members = wait_for(complete, 10, "every member's client URLs in a follower's member list")
    assert len(members) == len(backend.urls)
    for m in members:
        assert {"ID", "name", "peerURLs", "clientURLs"} <= set(m), m
        assert int(m["ID"]) > 0 and m["peerURLs"]
    assert sorted(u for m in members for u in m["clientURLs"]) == sorted(backend.urls)
