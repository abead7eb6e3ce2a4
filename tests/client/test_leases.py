"""The client's lease calls and keep-alive against raftkv's own HTTP API over ``LocalKV``.

Pinned down: every lease call round-trips with typed results; unknown leases are typed errors
(``LeaseNotFoundError``) except for time-to-live, which answers ``ttl_s == -1`` as etcd does;
bad input fails before anything is sent; grants and revokes carry the client id and the same
request id on every retry (and a retried grant whose answer was lost is applied once);
``keep_alive`` keeps a short lease alive past its TTL (a lease granted alongside it without
keep-alive expires meanwhile), retries through failures, fails over to another endpoint,
stops with ``LeaseNotFoundError`` when the lease is revoked and with the last failure when no
refresh gets through within the TTL, and stops cleanly on close. No timing assertions: every
wait polls for a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest

from kvserver.client import (
    AsyncClient,
    Client,
    ClientError,
    InvalidArgumentError,
    KeepAlive,
    Lease,
    LeaseExistsError,
    LeaseNotFoundError,
    NoLeaderError,
    NotFoundError,
    SyncKeepAlive,
    UnavailableError,
)
from kvserver.client import leases as leases_mod
from kvserver.kvpb.service_errors import no_leader
from tests.client.fakeserver import FAST
from tests.client.servers import Served
from tests.support.wait import async_wait_for, wait_for

DEADLINE_S = 10.0


@pytest.fixture
def api():
    served = Served().start()
    yield served
    served.close()


@pytest.fixture
def api2():
    served = Served(listeners=2).start()
    yield served
    served.close()


# ---------------------------------------------------------------------------------------------
# The calls


def test_every_lease_call_round_trips(api):
    with Client(api.url, **FAST) as c:
        first = c.lease_grant(60)
        assert isinstance(first, Lease) and first.id > 0 and first.ttl_s == 60
        assert first.header.member_id == api.kv.member_id
        chosen = c.lease_grant(30, lease_id=0x1234)
        assert (chosen.id, chosen.ttl_s) == (0x1234, 30)
        c.put("workers/a", "up", lease=chosen.id)
        c.put("workers/b", "up", lease=chosen.id)
        c.put("other", "x")

        ttl = c.lease_time_to_live(chosen.id, keys=True)
        assert ttl.id == chosen.id and ttl.granted_ttl_s == 30 and 0 <= ttl.ttl_s <= 30
        assert ttl.keys == (b"workers/a", b"workers/b") and not ttl.expired
        assert c.lease_time_to_live(chosen.id).keys == ()  # keys only when asked for

        assert set(c.lease_leases().ids) == {first.id, chosen.id}
        assert c.lease_keepalive_once(chosen.id) == 30

        revoked = c.lease_revoke(chosen.id)
        assert revoked.revision == c.status().revision  # the keys' deletion is a revision
        assert c.get("workers/a") is None and c.get("workers/b") is None
        assert c.get("other").value == b"x"
        gone = c.lease_time_to_live(chosen.id)
        assert gone.expired and gone.ttl_s == -1
        assert c.lease_leases().ids == (first.id,)


def test_ttl_zero_gets_the_servers_minimum(api):
    with Client(api.url, **FAST) as c:
        assert c.lease_grant(0).ttl_s == api.kv.lessor.min_ttl_s


def test_unknown_leases_are_typed_errors(api):
    with Client(api.url, **FAST) as c:
        with pytest.raises(LeaseNotFoundError) as e:
            c.lease_revoke(0x77)
        assert isinstance(e.value, NotFoundError) and not e.value.retryable
        assert "requested lease not found" in str(e.value)
        assert len(e.value.attempts) == 1  # not retried
        with pytest.raises(LeaseNotFoundError):
            c.lease_keepalive_once(0x77)
        with pytest.raises(LeaseNotFoundError):
            c.put("k", "v", lease=0x77)
        assert c.get("k") is None
        with pytest.raises(LeaseNotFoundError):
            c.keep_alive(0x77)  # the first refresh fails: nothing runs in the background
        lease = c.lease_grant(10, lease_id=0x99)
        with pytest.raises(LeaseExistsError):
            c.lease_grant(10, lease_id=lease.id)
        assert c.lease_leases().ids == (0x99,)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.lease_grant(-1),
        lambda c: c.lease_grant(1.5),
        lambda c: c.lease_grant(True),
        lambda c: c.lease_grant(5, lease_id=-3),
        lambda c: c.lease_grant(5, lease_id=1 << 63),
        lambda c: c.lease_revoke(0),
        lambda c: c.lease_revoke("12"),
        lambda c: c.lease_keepalive_once(-1),
        lambda c: c.lease_time_to_live(1 << 64),
        lambda c: c.keep_alive(0),
        lambda c: c.keep_alive(5, interval_s=0),
    ],
)
def test_bad_input_fails_before_sending(api, call):
    with Client(api.url, **FAST) as c:
        with pytest.raises(ValueError):
            call(c)
    assert api.kv.write_ids == [] and api.kv.calls["LeaseKeepAliveRequest"] == 0
    assert len(api.kv.lessor) == 0


def test_server_side_invalid_ttl_is_invalid_argument(api):
    with Client(api.url, **FAST) as c, pytest.raises(ClientError) as e:
        c.lease_grant(1 << 62)  # over the server's maximum TTL: refused, not retried
    assert not e.value.retryable and len(e.value.attempts) == 1
    assert len(api.kv.lessor) == 0


def test_writes_resend_the_same_ids_on_retry(api):
    api.kv.fail_once = {"grant", "revoke"}  # their first attempts: "no leader"
    with Client(api.url, **FAST) as c:
        lease = c.lease_grant(10)
        c.lease_revoke(lease.id)
    (g1, g2, r1, r2) = api.kv.write_ids
    assert g1 == g2 and r1 == r2
    assert g1[0] == "grant" and r1[0] == "revoke"
    assert g1[1] == r1[1] == c.client_id
    assert g1[2] != r1[2]  # a new call, a new request id
    assert len(api.kv.lessor) == 0


def test_retried_grant_after_a_lost_answer_is_applied_once(api):
    api.kv.slow_grants, api.kv.delay_s = 1, 0.6
    with Client(api.url, **dict(FAST, attempt_timeout_s=0.2)) as c:
        lease = c.lease_grant(10)
        assert c.lease_leases().ids == (lease.id,)
    ids = [x for x in api.kv.write_ids if x[0] == "grant"]
    assert len(ids) == 2 and ids[0] == ids[1]  # the server saw it twice, applied it once


def test_retryable_failures_are_retried_then_reported(api):
    api.kv.fail_with = no_leader()
    with Client(api.url, retries=2, **FAST) as c:
        with pytest.raises(NoLeaderError) as e:
            c.lease_keepalive_once(5)
        assert len(e.value.attempts) == 3
        with pytest.raises(NoLeaderError):
            c.lease_time_to_live(5)


def test_sync_signatures_match_async():
    for name in (
        "lease_grant",
        "lease_revoke",
        "lease_keepalive_once",
        "lease_time_to_live",
        "lease_leases",
        "keep_alive",
    ):
        sync_params = list(inspect.signature(getattr(Client, name)).parameters.values())
        async_params = list(inspect.signature(getattr(AsyncClient, name)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in sync_params] == [
            (p.name, p.kind, p.default) for p in async_params
        ], name


# ---------------------------------------------------------------------------------------------
# Keep-alive


async def test_async_keep_alive_keeps_a_short_lease_past_its_ttl(api):
    async with AsyncClient(api.url, **FAST) as c:
        kept = await c.lease_grant(1)
        control = await c.lease_grant(1)  # granted after ``kept``: expires no sooner
        await c.put("kept/key", "v", lease=kept.id)
        refreshed: list[int] = []
        async with c.keep_alive(kept.id, on_refresh=refreshed.append) as ka:
            assert isinstance(ka, KeepAlive) and ka.alive and ka.refreshes == 1
            await async_wait_for(
                lambda: api.kv.lessor.is_expired(control.id),
                DEADLINE_S,
                "the control lease to expire",
            )
            assert not api.kv.lessor.is_expired(kept.id)
            assert ka.alive and ka.error is None and ka.refreshes >= 2
            assert (await c.lease_time_to_live(kept.id)).ttl_s >= 0
        assert not ka.alive and ka.error is None  # closed cleanly
        assert refreshed == [1] * ka.refreshes
        assert api.run(api.kv.expire_leases) == [control.id]
        assert (await c.get("kept/key")).value == b"v"


def test_sync_keep_alive_runs_on_the_clients_loop_thread(api):
    import threading

    threads: set[str] = set()
    with Client(api.url, **FAST) as c:
        kept = c.lease_grant(1)
        control = c.lease_grant(1)
        before = threading.active_count()
        with c.keep_alive(
            kept.id, on_refresh=lambda ttl: threads.add(threading.current_thread().name)
        ) as ka:
            assert isinstance(ka, SyncKeepAlive) and ka.alive and ka.ttl_s == 1
            assert threading.active_count() == before  # no thread of its own
            wait_for(
                lambda: api.kv.lessor.is_expired(control.id), DEADLINE_S, "the control to expire"
            )
            assert not api.kv.lessor.is_expired(kept.id) and ka.refreshes >= 2
            assert not ka.wait(0.01)  # still running
        assert not ka.alive and ka.error is None
        assert ka.wait(1.0)  # stopped: returns at once, nothing raised
        assert threads == {"raftkv-client-loop"}
        assert c.lease_time_to_live(kept.id).ttl_s >= 0


def test_keep_alive_stops_with_lease_not_found_when_revoked(api):
    with Client(api.url, **FAST) as c:
        lease = c.lease_grant(30)
        ka = c.keep_alive(lease.id, interval_s=0.05)
        c.lease_revoke(lease.id)
        with pytest.raises(LeaseNotFoundError):
            ka.wait(DEADLINE_S)
        assert not ka.alive and isinstance(ka.error, LeaseNotFoundError)
        ka.close()  # harmless after it stopped


async def test_leaving_the_block_raises_when_the_lease_was_lost(api):
    async with AsyncClient(api.url, **FAST) as c:
        lease = await c.lease_grant(30)
        with pytest.raises(LeaseNotFoundError):
            async with c.keep_alive(lease.id, interval_s=0.05) as ka:
                await c.lease_revoke(lease.id)
                await async_wait_for(lambda: not ka.alive, DEADLINE_S, "the keep-alive to stop")
        # an exception from the body wins over the keep-alive's
        lease = await c.lease_grant(30)
        with pytest.raises(KeyError):
            async with c.keep_alive(lease.id, interval_s=0.05) as ka:
                await c.lease_revoke(lease.id)
                await async_wait_for(lambda: not ka.alive, DEADLINE_S, "the keep-alive to stop")
                raise KeyError("body")


def test_keep_alive_retries_failed_refreshes_until_they_succeed(api):
    """Refreshes fail (the client's own retries give up quickly) but not for longer than
    the TTL: the keep-alive keeps trying and the lease survives."""
    with Client(api.url, **dict(FAST, retries=0)) as c:
        lease = c.lease_grant(5)
        with c.keep_alive(lease.id, interval_s=0.05) as ka:
            api.kv.fail_with = no_leader()
            wait_for(lambda: ka.failures >= 2, DEADLINE_S, "two failed refreshes")
            assert ka.alive
            api.kv.fail_with = None
            refreshes = ka.refreshes
            wait_for(lambda: ka.refreshes >= refreshes + 2, DEADLINE_S, "refreshes to resume")
            assert ka.alive and ka.error is None
        assert not api.kv.lessor.is_expired(lease.id)


def test_keep_alive_gives_up_when_no_refresh_gets_through_within_the_ttl(api):
    with Client(api.url, **dict(FAST, retries=0)) as c:
        lease = c.lease_grant(1)
        ka = c.keep_alive(lease.id)
        api.kv.fail_with = no_leader()
        with pytest.raises(NoLeaderError) as e:
            ka.wait(DEADLINE_S)
        assert isinstance(e.value, UnavailableError)
        assert "may have expired" in str(e.value) and "no leader" in str(e.value)
        assert not ka.alive and ka.failures >= 1
        ka.close()


def test_keep_alive_fails_over_to_another_endpoint(api2):
    with Client(api2.urls, **FAST) as c:
        lease = c.lease_grant(1)
        control = c.lease_grant(1)
        with c.keep_alive(lease.id) as ka:
            api2.stop_listener(0)
            refreshes = ka.refreshes
            wait_for(lambda: ka.refreshes >= refreshes + 2, DEADLINE_S, "refreshes through the 2nd")
            wait_for(
                lambda: api2.kv.lessor.is_expired(control.id), DEADLINE_S, "the control to expire"
            )
            assert ka.alive and not api2.kv.lessor.is_expired(lease.id)
        assert c.lease_time_to_live(lease.id).ttl_s >= 0


def test_keep_alive_stops_when_the_client_closes(api):
    c = Client(api.url, **FAST)
    lease = c.lease_grant(30)
    ka = c.keep_alive(lease.id, interval_s=0.05)
    assert ka.alive
    c.close()
    assert not ka.alive
    ka.close()  # the loop is gone: nothing to do, no error


async def test_async_keep_alive_start_and_close_by_hand(api):
    async with AsyncClient(api.url, **FAST) as c:
        lease = await c.lease_grant(30)
        ka = c.keep_alive(lease.id, interval_s=0.05)
        with pytest.raises(ClientError):
            await ka.wait()  # not started
        await ka.start()
        with pytest.raises(ClientError):
            await ka.start()  # once only
        await async_wait_for(lambda: ka.refreshes >= 3, DEADLINE_S, "three refreshes")
        await ka.close()
        await ka.wait()  # returns: closed, not failed
        assert not ka.alive and ka.error is None and "stopped" in repr(ka)


class GatedLeaseClient:
    """Stands in for ``AsyncClient`` under a ``KeepAlive``: each ``lease_keepalive_once``
    waits until the test answers the future it queued in ``calls``."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue()

    async def lease_keepalive_once(self, lease_id: int) -> int:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.calls.put_nowait(answer)
        return await answer


async def close_as_a_refresh_completes(keepalive_class=KeepAlive) -> KeepAlive:
    """``close()`` cancels the refresh task in the same loop iteration in which the refresh
    call's answer arrives: the race of CPython gh-86296, made deterministic. On Python 3.11
    ``asyncio.wait_for`` returned the answer and dropped the cancel, so the refresh loop went
    on and ``close()`` never returned. (``keepalive_class``: so the old code can be measured
    with the same steps.)"""
    client = GatedLeaseClient()
    ka = keepalive_class(client, 0x51, interval_s=0.01)  # type: ignore[arg-type]
    async with asyncio.timeout(DEADLINE_S):
        starting = asyncio.ensure_future(ka.start())
        (await client.calls.get()).set_result(30)  # the first refresh, in start()
        await starting
        in_flight = await client.calls.get()  # the background task's next refresh
    in_flight.set_result(30)  # its answer is ready to be delivered...
    try:
        async with asyncio.timeout(DEADLINE_S):
            await ka.close()  # ...and the cancel is requested before the loop runs again
    except TimeoutError:
        raise AssertionError("close() hung: the refresh loop lost its cancellation") from None
    return ka


def test_close_is_not_lost_when_a_refresh_completes_at_the_same_moment():
    for _ in range(20):  # deterministic; repeated to cover whatever differs between loops
        ka = asyncio.run(close_as_a_refresh_completes())
        assert not ka.alive and ka.error is None and ka.refreshes in (1, 2)


# ---------------------------------------------------------------------------------------------
# Pieces


def test_keepalive_answer_lines():
    header = {"header": {"revision": "3"}}
    assert leases_mod.decode_keepalive({"result": {**header, "ID": "5", "TTL": "7"}}, 5) == 7
    with pytest.raises(LeaseNotFoundError):
        leases_mod.decode_keepalive({"result": {**header, "ID": "5"}}, 5)
    with pytest.raises(NoLeaderError):
        leases_mod.decode_keepalive(
            {
                "error": {
                    "grpc_code": 14,
                    "http_code": 503,
                    "message": "etcdserver: no leader",
                    "http_status": "Service Unavailable",
                }
            },
            5,
        )
    with pytest.raises(InvalidArgumentError):
        leases_mod.decode_keepalive({"error": {"grpc_code": 3, "message": "bad"}}, 5)
    with pytest.raises(ClientError):
        leases_mod.decode_keepalive({"result": {"ID": "6", "TTL": "7"}}, 5)
    with pytest.raises(ClientError):
        leases_mod.decode_keepalive([], 5)


def test_answers_decode_etcds_shapes():
    doc = json.loads(
        '{"header":{"revision":"4"},"ID":"7587","TTL":"9","grantedTTL":"10","keys":["YQ==","/w=="]}'
    )
    ttl = leases_mod.decode_time_to_live(doc)
    assert (ttl.id, ttl.ttl_s, ttl.granted_ttl_s, ttl.keys, ttl.revision) == (
        7587,
        9,
        10,
        (b"a", b"\xff"),
        4,
    )
    assert leases_mod.decode_time_to_live({"ID": "1", "TTL": "-1"}).expired
    assert leases_mod.decode_leases({"leases": [{"ID": "1"}, {"ID": "2"}]}).ids == (1, 2)
    assert leases_mod.decode_leases({"header": {}}).ids == ()
    with pytest.raises(ClientError):
        leases_mod.decode_grant({"TTL": "5"})  # no ID


@pytest.mark.parametrize(
    "text,value",
    [
        ("694d5765fc71500b", 0x694D5765FC71500B),
        ("0x10", 16),
        ("10", 10),
        ("0X1f", 31),
        (" 0xff ", 255),
        ("7fffffffffffffff", (1 << 63) - 1),
    ],
)
def test_parse_lease_id(text, value):
    assert leases_mod.parse_lease_id(text) == value


@pytest.mark.parametrize(
    "text", ["", "0", "-5", "0x", "xyz", "0x8000000000000000", "9223372036854775808", "1.5"]
)
def test_parse_lease_id_refuses(text):
    with pytest.raises(ValueError):
        leases_mod.parse_lease_id(text)


def test_parse_lease_id_takes_zero_only_when_allowed():
    assert leases_mod.parse_lease_id("0", allow_zero=True) == 0
    assert leases_mod.parse_lease_id("0x0", allow_zero=True) == 0
    with pytest.raises(ValueError, match="out of range"):
        leases_mod.parse_lease_id("0")
    with pytest.raises(ValueError):
        leases_mod.parse_lease_id("-1", allow_zero=True)


@pytest.mark.parametrize("value", [1, 16, 0x694D5765FC71500B, 1234567890, (1 << 63) - 1])
def test_printed_lease_ids_parse_back(value):
    text = leases_mod.format_lease_id(value)
    assert leases_mod.parse_lease_id(text) == value
    assert len(text.removeprefix("0x")) >= 16


# ---------------------------------------------------------------------------------------------
# Against a real etcd 3.4 (its gateway is the reference for the JSON shapes)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    from tests.conftest import require_program
    from tests.etcd_process import etcd_process

    require_program("etcd")
    with etcd_process(str(tmp_path_factory.mktemp("etcd")), name="e1") as proc:
        with Client(proc.url, timeout_s=1.0, retries=0) as probe:

            def has_leader() -> bool:
                try:
                    return bool(probe.status().leader)
                except ClientError:
                    return False

            wait_for(has_leader, 20.0, f"etcd to elect itself; see {proc.log_path}")
        yield proc.url


@pytest.mark.slow
@pytest.mark.external
def test_lease_calls_against_etcd(etcd):
    with Client(etcd, **FAST) as c:
        lease = c.lease_grant(30)
        assert lease.id > 0 and lease.ttl_s == 30
        chosen = c.lease_grant(20, lease_id=0x1234)
        assert chosen.id == 0x1234
        with pytest.raises(LeaseExistsError):
            c.lease_grant(20, lease_id=0x1234)
        c.put("etcd/k", "v", lease=chosen.id)
        ttl = c.lease_time_to_live(chosen.id, keys=True)
        assert ttl.granted_ttl_s == 20 and 0 < ttl.ttl_s <= 20 and ttl.keys == (b"etcd/k",)
        assert {lease.id, chosen.id} <= set(c.lease_leases().ids)
        assert c.lease_keepalive_once(chosen.id) == 20
        with c.keep_alive(chosen.id, interval_s=0.05) as ka:
            wait_for(lambda: ka.refreshes >= 3, DEADLINE_S, "three refreshes through etcd")
        c.lease_revoke(chosen.id)
        assert c.get("etcd/k") is None
        assert c.lease_time_to_live(chosen.id).expired
        with pytest.raises(LeaseNotFoundError):
            c.lease_revoke(chosen.id)
        with pytest.raises(LeaseNotFoundError):
            c.lease_keepalive_once(chosen.id)
        with pytest.raises(LeaseNotFoundError):
            c.put("etcd/k", "v", lease=chosen.id)
        c.lease_revoke(lease.id)


# ---------------------------------------------------------------------------------------------
# On a three-node raftkv of real processes: the leader is killed while the client keeps a
# lease alive (keep-alive is leader-only; the client must find the new leader)


@pytest.mark.slow
def test_keep_alive_survives_a_leader_kill_on_a_real_cluster(tmp_path):
    import signal

    from kvserver.localcluster.launcher import LocalCluster
    from tests.cluster.conftest import FAST_TIMING
    from tests.cluster.harness import leader_of, wait_healthy

    cluster = LocalCluster(str(tmp_path / "c"), size=3, extra_args=FAST_TIMING)
    try:
        cluster.start()
        wait_healthy(cluster)
        urls = [n.client_url for n in cluster.nodes]
        with Client(urls, timeout_s=5.0, attempt_timeout_s=1.0, connect_timeout_s=0.5) as c:
            lease = c.lease_grant(2)
            control = c.lease_grant(2)  # not kept alive: must be gone afterwards
            c.put("held/a", "v", lease=lease.id)
            c.put("dropped/a", "v", lease=control.id)
            with c.keep_alive(lease.id) as ka:
                wait_for(lambda: ka.refreshes >= 2, DEADLINE_S, "two refreshes before the kill")
                old = leader_of(cluster)
                assert old is not None
                cluster.kill(old, signal.SIGKILL)
                survivors = [n for n in cluster.nodes if n.alive()]
                wait_healthy(cluster, timeout_s=30, among=survivors)
                refreshes = ka.refreshes
                wait_for(
                    lambda: ka.refreshes >= refreshes + 3, 30.0, "refreshes via the new leader"
                )
                wait_for(lambda: c.get("dropped/a") is None, 30.0, "the control lease to expire")
                assert ka.alive and ka.error is None
            assert c.get("held/a").value == b"v"
            assert not c.lease_time_to_live(lease.id).expired
            assert c.lease_time_to_live(control.id).expired
    finally:
        cluster.stop()


async def test_close_from_the_refresh_callback(api):
    async with AsyncClient(api.url, **FAST) as c:
        lease = await c.lease_grant(30)
        holder: list[KeepAlive] = []

        async def on_refresh(ttl_s: int) -> None:
            if len(holder) and holder[0].refreshes >= 3:
                await holder[0].close()

        ka = c.keep_alive(lease.id, interval_s=0.02, on_refresh=on_refresh)
        holder.append(ka)
        await ka.start()
        await asyncio.wait_for(ka.wait(), DEADLINE_S)
        assert not ka.alive and ka.error is None and ka.refreshes == 3

    with Client(api.url, **FAST) as c:
        lease = c.lease_grant(30)
        box: list[SyncKeepAlive] = []
        ka = c.keep_alive(
            lease.id,
            interval_s=0.02,
            on_refresh=lambda ttl: box and box[0].refreshes >= 3 and box[0].close(),
        )
        box.append(ka)
        assert ka.wait(DEADLINE_S) and not ka.alive and ka.error is None
