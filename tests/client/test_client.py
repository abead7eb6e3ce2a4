"""The client library against a fake cluster: round trips, routing, failover, retries, errors.

Properties pinned down (the client library, and request-id deduplication):
- every API call round-trips through etcd's v3 JSON gateway dialect into typed results;
- writes and linearizable reads go to the leader; the leader is found through
  /v3/maintenance/status and, when it is not a configured endpoint, the member list;
- a dead or refusing endpoint is skipped (failover), 503s are retried elsewhere/later;
- a write retried after a timeout carries the same (client id, request id) pair, so the
  server applies it once; the next write gets a new request id;
- non-retryable failures (400, compacted, 404) are raised after exactly one request;
- every call ends within its deadline with a typed error naming the endpoints tried.
"""

import asyncio
import inspect
import threading

import pytest

from kvserver.client import (
    AsyncClient,
    Client,
    ClientError,
    Cmp,
    CompactedError,
    ConnectionFailedError,
    FutureRevisionError,
    InvalidArgumentError,
    KeyValue,
    LeaderChangedError,
    NoLeaderError,
    Op,
    RequestTimeoutError,
    ResponseFormatError,
    Txn,
)
from tests.client.fakeserver import FAST, Fail, FakeCluster, Hang, dead_url

NO_LEADER = Fail(503, 14, "etcdserver: no leader")


# ---------------------------------------------------------------------------------------------
# Round trips


async def test_round_trip_every_call(cluster):
    async with AsyncClient(cluster.urls, **FAST) as c:
        put = await c.put("a/1", "one")
        assert put.revision == 2 and put.prev_kv is None
        put2 = await c.put(b"a/1", b"uno", prev_kv=True)
        assert put2.revision == 3
        assert put2.prev_kv == KeyValue(b"a/1", b"one", 2, 2, 1, 0)
        await c.put("a/2", "two", lease=7)
        await c.put("b", "bee")

        kv = await c.get("a/1")
        assert kv == KeyValue(b"a/1", b"uno", 2, 3, 2, 0)
        assert await c.get("missing") is None

        r = await c.range("a/", prefix=True)
        assert [kv.key for kv in r.kvs] == [b"a/1", b"a/2"]
        assert r.count == 2 and not r.more and r.revision == 5
        assert r.kvs[1].lease == 7
        r = await c.range("a/", prefix=True, limit=1, sort_order="descend")
        assert [kv.key for kv in r.kvs] == [b"a/2"] and r.more and r.count == 2
        r = await c.range("a/", prefix=True, keys_only=True)
        assert [kv.value for kv in r.kvs] == [b"", b""]
        r = await c.range("a/", prefix=True, count_only=True)
        assert r.kvs == () and r.count == 2
        r = await c.range("a", b"b\0")  # [a, b\0): everything
        assert r.count == 3
        r = await c.range("a", b"\0")  # every key >= a
        assert r.count == 3

        d = await c.delete("a/", prefix=True, prev_kv=True)
        assert d.deleted == 2 and [kv.key for kv in d.prev_kvs] == [b"a/1", b"a/2"]
        assert d.revision == 6
        d = await c.delete("nothing")
        assert d.deleted == 0 and d.revision == 6

        t = await c.txn(
            Txn()
            .when(Cmp.version("lock") == 0)
            .then(Op.put("lock", "me"), Op.get("lock"))
            .otherwise(Op.get("lock"))
        )
        assert t.succeeded and t.revision == 7
        assert t.responses[0].revision == 7
        assert t.responses[1].kvs[0].value == b"me"
        t = await c.txn(
            Txn()
            .when(Cmp.version("lock") == 0)
            .then(Op.put("lock", "you"))
            .otherwise(Op.get("lock"))
        )
        assert not t.succeeded and t.responses[0].kvs[0].value == b"me"
        t = await c.txn(Txn().when(Cmp.value("lock") == "me").then(Op.delete("lock")))
        assert t.succeeded and t.responses[0].deleted == 1

        comp = await c.compact(5)
        assert comp.revision == 8
        with pytest.raises(CompactedError):
            await c.range("b", revision=3)
        with pytest.raises(FutureRevisionError):
            await c.range("b", revision=100)

        status = await c.status()
        assert status.leader == cluster.nodes[0].member_id
        assert status.raft_term == cluster.term and status.revision == 8
        assert status.db_size_bytes == 24576 and status.version == "3.5.0"
        members = await c.member_list()
        assert [m.name for m in members] == ["n1", "n2", "n3"]
        assert members[1].client_urls == (cluster.nodes[1].url,)


def test_member_list_falls_back_to_v1_status():
    cluster = FakeCluster(size=2, serve_member_list=False).start()
    try:
        with Client(cluster.urls, **FAST) as c:
            members = c.member_list()
        assert [m.id for m in members] == [n.member_id for n in cluster.nodes]
        assert "/v1/status" in cluster.nodes[0].paths() + cluster.nodes[1].paths()
    finally:
        cluster.close()


def test_sync_client_round_trip_and_threads(cluster):
    with Client(cluster.urls, **FAST) as c:
        assert c.put("k", "v").revision == 2
        assert c.get("k").value == b"v"
        results = []

        def worker(i):
            for j in range(10):
                results.append(c.put(f"t/{i}/{j}", "x").revision)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == list(range(3, 43))  # 40 distinct writes, each applied once
        assert c.range("t/", prefix=True, count_only=True).count == 40
        assert c.statuses()[0].status.is_leader
    with pytest.raises(ClientError, match="closed"):
        c.get("k")
    assert c._thread is not None and not c._thread.is_alive()  # close() stopped the loop


def test_sync_client_signatures_match_async():
    for name in (
        "put",
        "get",
        "range",
        "delete",
        "txn",
        "compact",
        "status",
        "statuses",
        "member_list",
        "find_leader",
    ):
        sync_params = list(inspect.signature(getattr(Client, name)).parameters.values())
        async_params = list(inspect.signature(getattr(AsyncClient, name)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in sync_params] == [
            (p.name, p.kind, p.default) for p in async_params
        ], name


async def test_sync_client_works_inside_a_running_event_loop(cluster):
    """A blocking call from a thread that runs an event loop (Jupyter-like) still works."""
    with Client(cluster.urls, **FAST) as c:
        revision = c.put("from-loop", "x").revision
    assert revision == 2


# ---------------------------------------------------------------------------------------------
# Routing: leader preference and discovery


async def test_writes_and_linearizable_reads_go_to_the_leader(cluster):
    cluster.set_leader(2)
    leader = cluster.nodes[2]

    async with AsyncClient(cluster.urls, **FAST) as c:
        for i in range(5):
            await c.put(f"k{i}", "v")
            await c.get(f"k{i}")
        assert c.leader_endpoint == leader.url
    assert len(leader.kv_requests()) == 10
    for follower in cluster.nodes[:2]:
        assert follower.kv_requests() == []
        assert set(follower.paths()) <= {"/v3/maintenance/status"}


async def test_concurrent_calls_share_one_leader_discovery(cluster):
    cluster.set_leader(1)
    async with AsyncClient(cluster.urls, **FAST) as c:
        results = await asyncio.gather(*(c.put(f"k{i}", "v") for i in range(20)))
    assert sorted(r.revision for r in results) == list(range(2, 22))
    assert [n.paths().count("/v3/maintenance/status") for n in cluster.nodes] == [1, 1, 1]
    assert len(cluster.nodes[1].kv_requests()) == 20


async def test_serializable_reads_stay_on_the_endpoint_that_answered(cluster):
    cluster.set_leader(2)

    async with AsyncClient(cluster.urls, **FAST) as c:
        for _ in range(4):
            await c.range("x", serializable=True)
    kv_counts = [len(n.kv_requests()) for n in cluster.nodes]
    assert sorted(kv_counts) == [0, 0, 4]  # sticky: all on one node
    # Serializable reads never needed the leader, so nobody was asked for it.
    assert all("/v3/maintenance/status" not in n.paths() for n in cluster.nodes)


def test_leader_outside_the_endpoint_list_is_found_through_the_member_list():
    cluster = FakeCluster(size=2, leader_index=1, serve_member_list=False).start()
    try:
        with Client([cluster.nodes[0].url], **FAST) as c:
            c.put("k", "v")
            assert c.leader_endpoint == cluster.nodes[1].url
        assert len(cluster.nodes[1].kv_requests()) == 1
        assert cluster.nodes[0].kv_requests() == []
        assert "/v1/status" in cluster.nodes[0].paths()
    finally:
        cluster.close()


def test_no_leader_known_falls_back_to_any_endpoint():
    cluster = FakeCluster(size=2, leader_index=None).start()
    try:
        with Client(cluster.urls, **FAST) as c:
            assert c.put("k", "v").revision == 2
            assert c.leader_endpoint is None
    finally:
        cluster.close()


async def test_leader_change_is_followed(cluster):
    async with AsyncClient(cluster.urls, **FAST) as c:
        await c.put("k", "1")
        assert c.leader_endpoint == cluster.nodes[0].url
        # The leader crashes; n2 wins the election.
        cluster.nodes[0].stop()
        cluster.set_leader(1)
        assert (await c.put("k", "2")).revision == 3
        assert c.leader_endpoint == cluster.nodes[1].url
        # n2 steps down ("leader changed" for the request in flight), n3 takes over.
        cluster.nodes[1].script.append(
            Fail(503, 14, "etcdserver: leader changed", path="/v3/kv/put")
        )
        cluster.set_leader(2)
        assert (await c.put("k", "3")).revision == 4
        assert c.leader_endpoint == cluster.nodes[2].url
    assert cluster.store.applied.count("/v3/kv/put") == 3
    assert len(cluster.nodes[2].kv_requests()) == 1


# ---------------------------------------------------------------------------------------------
# Failover


def test_failover_from_a_refusing_endpoint(cluster):
    dead = dead_url()
    with Client([dead, cluster.nodes[1].url], prefer_leader=False, **FAST) as c:
        assert c.put("k", "v").revision == 2
        assert c.get("k", serializable=True).value == b"v"
    assert len(cluster.nodes[1].kv_requests()) == 2


def test_failover_from_a_dead_leader_endpoint_when_discovery_fails():
    cluster = FakeCluster(size=2, leader_index=0).start()
    try:
        dead = dead_url()
        with Client([dead, cluster.nodes[1].url], **FAST) as c:
            # The leader (n1) is not configured and not reachable through n1's URL either.
            cluster.nodes[0].stop()
            assert c.put("k", "v").revision == 2
        assert len(cluster.nodes[1].kv_requests()) == 1
    finally:
        cluster.close()


async def test_503_is_retried_on_another_endpoint(cluster):
    cluster.nodes[0].script.append(Fail(503, 14, "etcdserver: no leader", path="/v3/kv/put"))
    async with AsyncClient(cluster.urls, **FAST) as c:
        put = await c.put("k", "v")
    assert put.revision == 2
    puts = [r for n in cluster.nodes for r in n.kv_requests()]
    assert len(puts) == 2
    assert len({(r.client_id, r.request_id) for r in puts}) == 1
    assert cluster.store.applied == ["/v3/kv/put"]


def test_retries_are_bounded_and_end_with_the_last_error():
    cluster = FakeCluster(size=1).start()
    try:
        for _ in range(10):
            cluster.nodes[0].script.append(
                Fail(503, 14, "etcdserver: no leader", path="/v3/kv/put")
            )
        with Client(cluster.urls, retries=3, **FAST) as c, pytest.raises(NoLeaderError) as e:
            c.put("k", "v")
        assert len(cluster.nodes[0].kv_requests()) == 4  # first try + 3 retries
        assert len(e.value.attempts) == 4
        assert "etcdserver: no leader" in str(e.value) and "put 'k'" in str(e.value)
        assert cluster.store.applied == []
    finally:
        cluster.close()


def test_all_endpoints_dead_is_a_connection_failure_listing_them():
    dead = [dead_url(), dead_url()]
    with Client(dead, retries=4, **FAST) as c, pytest.raises(ConnectionFailedError) as e:
        c.get("k")
    assert set(e.value.endpoints) == set(dead)
    assert len(e.value.attempts) == 5
    for url in dead:
        assert url in str(e.value)
    assert "connection refused" in str(e.value)


# ---------------------------------------------------------------------------------------------
# Retries of writes: the same request id, applied once


def test_write_retried_after_timeout_resends_the_same_request_id():
    cluster = FakeCluster(size=1).start()
    try:
        node = cluster.nodes[0]
        # The put is applied, but its answer comes after the client gave up on the attempt.
        node.script.append(Hang(seconds=0.6, path="/v3/kv/put"))
        with Client(cluster.urls, **dict(FAST, attempt_timeout_s=0.2)) as c:
            before = c.status().revision
            result = c.put("k", "v")
            after = c.status().revision
            second = c.put("k2", "v")
        puts = [r for r in node.kv_requests() if r.path == "/v3/kv/put"]
        assert len(puts) == 3
        first_try, retry, next_write = puts
        assert first_try.client_id == retry.client_id == str(c.client_id)
        assert first_try.request_id == retry.request_id
        assert first_try.body == retry.body
        assert int(next_write.request_id) > int(retry.request_id)
        assert after == before + 1  # applied once
        assert result.revision == after
        assert second.revision == after + 1
    finally:
        cluster.close()


def test_reads_carry_no_request_id(cluster):
    with Client(cluster.urls, **FAST) as c:
        c.get("k")
        c.put("k", "v")
    reqs = cluster.nodes[0].kv_requests()
    assert reqs[0].request_id is None and reqs[1].request_id is not None


def test_two_clients_get_different_client_ids(cluster):
    with Client(cluster.urls, **FAST) as a, Client(cluster.urls, **FAST) as b:
        a.put("k", "1")
        b.put("k", "2")
    ids = {r.client_id for r in cluster.nodes[0].kv_requests()}
    assert len(ids) == 2
    assert cluster.store.applied == ["/v3/kv/put", "/v3/kv/put"]


def test_compaction_confirmed_by_a_retry_succeeds():
    cluster = FakeCluster(size=1).start()
    try:
        cluster.nodes[0].script.append(Hang(seconds=0.6, path="/v3/kv/compaction"))
        with Client(cluster.urls, **dict(FAST, attempt_timeout_s=0.2)) as c:
            for i in range(3):
                c.put("k", str(i))
            c.compact(3)
        assert cluster.store.compact_revision == 3
        assert cluster.store.applied.count("compact 3") == 1
    finally:
        cluster.close()


# ---------------------------------------------------------------------------------------------
# No retry for failures a retry cannot fix


@pytest.mark.parametrize(
    "fail,error",
    [
        (Fail(400, 3, "etcdserver: key is not provided", path="/v3/kv/put"), InvalidArgumentError),
        (
            Fail(
                400, 11, "etcdserver: mvcc: required revision has been compacted", path="/v3/kv/put"
            ),
            CompactedError,
        ),
    ],
)
def test_client_errors_are_not_retried(cluster, fail, error):
    cluster.nodes[0].script.append(fail)
    with Client(cluster.urls, **FAST) as c, pytest.raises(error) as e:
        c.put("k", "v")
    assert len(cluster.nodes[0].kv_requests()) == 1
    assert e.value.http_status == 400 and not e.value.retryable
    assert fail.message in str(e.value)


def test_server_validation_error_is_typed(cluster):
    with Client(cluster.urls, **FAST) as c, pytest.raises(InvalidArgumentError) as e:
        c.put("", "v")
    assert "key is not provided" in str(e.value)
    assert sum(len(n.kv_requests()) for n in cluster.nodes) == 1


def test_leader_changed_on_the_last_attempt_is_reported_as_such():
    cluster = FakeCluster(size=1).start()
    try:
        cluster.nodes[0].script.append(
            Fail(503, 14, "etcdserver: leader changed", path="/v3/kv/put")
        )
        with Client(cluster.urls, retries=0, **FAST) as c, pytest.raises(LeaderChangedError):
            c.put("k", "v")
    finally:
        cluster.close()


# ---------------------------------------------------------------------------------------------
# Timeouts


def test_hung_endpoint_times_out_with_a_typed_error(blackhole):
    with Client([blackhole.url], **dict(FAST, timeout_s=0.8, attempt_timeout_s=0.2)) as c:
        with pytest.raises(RequestTimeoutError) as e:
            c.get("k", serializable=True)
    assert isinstance(e.value, TimeoutError)
    assert e.value.retryable
    assert 1 <= len(e.value.attempts) <= 4  # 0.8 s deadline / 0.2 s per attempt
    assert "no answer within" in str(e.value)


def test_hung_endpoint_is_skipped_for_a_live_one(cluster, blackhole):
    with Client(
        [blackhole.url, cluster.nodes[1].url],
        prefer_leader=False,
        **dict(FAST, attempt_timeout_s=0.2),
    ) as c:
        for i in range(3):
            assert c.put(f"k{i}", "v").revision == 2 + i
    # Sticky: once the live endpoint answered, the hung one is not tried again.
    assert len(cluster.nodes[1].kv_requests()) == 3


def test_server_side_request_timeout_is_retried_then_typed():
    cluster = FakeCluster(size=1).start()
    try:
        for _ in range(3):
            cluster.nodes[0].script.append(
                Fail(503, 14, "etcdserver: request timed out", path="/v3/kv/put")
            )
        with Client(cluster.urls, retries=2, **FAST) as c, pytest.raises(RequestTimeoutError):
            c.put("k", "v")
        assert len(cluster.nodes[0].kv_requests()) == 3
    finally:
        cluster.close()


# ---------------------------------------------------------------------------------------------
# Status of every endpoint


def test_statuses_report_each_endpoint_and_the_failures(cluster):
    dead = dead_url()
    with Client(cluster.urls + [dead], **FAST) as c:
        statuses = c.statuses()
    assert [s.endpoint for s in statuses] == cluster.urls + [dead]
    assert [s.status.is_leader for s in statuses[:3]] == [True, False, False]
    assert [s.status.member_id for s in statuses[:3]] == [n.member_id for n in cluster.nodes]
    assert statuses[3].status is None
    assert isinstance(statuses[3].error, ConnectionFailedError)


def test_an_async_client_refuses_a_second_event_loop(cluster):
    c = AsyncClient(cluster.urls, **FAST)
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(c.put("k", "v"))
        with pytest.raises(ClientError, match="another event loop"):
            asyncio.run(c.get("k"))
        first.run_until_complete(c.close())
    finally:
        first.close()


def test_answers_over_the_size_bound_are_refused(cluster):
    with Client(cluster.urls, max_response_bytes=300, **FAST) as c:
        c.put("big", "x" * 1000)
        with pytest.raises(ResponseFormatError, match="over the 300-byte limit"):
            c.get("big")


def test_bad_options_fail_in_the_constructor():
    with pytest.raises(ValueError):
        Client([])
    with pytest.raises(ValueError):
        Client("ftp://x:1")
    with pytest.raises(ValueError):
        AsyncClient("http://h:1", timeout_s=0)
    with pytest.raises(ValueError):
        AsyncClient("http://h:1", retries=-1)
