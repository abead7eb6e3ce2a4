"""The pipeline as users deploy it: the compose ``spark`` profile (three members, moto's S3, a
Spark standalone master and two workers), the example pipeline submitted with
``deploy/up.sh spark-demo`` (spark-submit --master spark://..., raftkv shipped as a wheel),
and faults in the middle of a run.

Every run must end as ``tests/deploy/spark_compose.check_pipeline`` says: each day committed
exactly once, the output equal to a local-mode run of the same input, the rows in raftkv, and
every PUT of them delivered to the feed exactly once by the changefeed, across restarts.
Faults, each while a run is between its first and last commit:

- the raftkv leader's container killed (and started again once the others have a leader):
  the run finishes by itself;
- the driver's container killed: the run is resubmitted and finishes, continuing from the
  commit log and the feed's checkpoint;
- the driver frozen past its lock's lease while a second driver is submitted: the second
  finishes the table; the first, thawed, is refused at its next fenced write and publishes
  nothing (its staging output stays unpublished debris);
- a worker's container disconnected from the network (``docker network disconnect``) until
  the run has committed another day without it, then connected again: the run finishes;
- the S3 container (the members' archive, the changefeed's ``archiveUrl``) frozen until the
  members' archive lags and another day is committed: the run finishes, and the archive
  catches up once S3 is back;
- the raftkv leader cut from the clients' network but not from its peers (the profile's two
  networks) while a driver that can reach only it runs: the member keeps applying what the
  others commit, a second driver takes the lock through the others and commits a day during
  the cut, the cut is healed and the second finishes; the first exits non-zero having lost
  its lock (refused by the store's fence once healed, or given up during the cut, depending
  on where the cut caught it) and publishes nothing after the take-over;
- S3 taken off the network while a changefeed reads cold history from the archive
  (``tests/deploy/spark_cold_feed_app.py``): the query fails and is restarted from its
  checkpoint until S3 is back, then delivers every event exactly once, in revision order.

The tests share one cluster (module fixture) and use one table each. Waits are bounded
polls; nothing asserts on timing (the times are printed for docs/spark.md).
"""

import re
import time

import pytest

from kvserver.client import Op, Txn
from kvserver.client.errors import ClientError
from kvserver.spark import demo
from kvserver.spark.commitlog import CommitLog
from tests.deploy.compose import NOT_YET, SERVICES, docker_command, remove_stale_projects
from tests.deploy.spark_compose import (
    Output,
    check_pipeline,
    client_of,
    committed_days,
    cut,
    driver_containers,
    finish,
    heal,
    local_demo,
    logs_on_failure,
    reachable,
    spark_cluster,
    status_inside,
    submit,
    submit_app,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.external, pytest.mark.timeout(2400)]

WAIT_S = 300


@pytest.fixture(scope="module")
def cluster():
    docker = docker_command()
    remove_stale_projects(docker)  # before the build: they hold the old image
    with spark_cluster(docker) as c:
        yield c


@pytest.fixture(scope="module")
def local(cluster, tmp_path_factory):
    """The local-mode run (table ``local``): its Parquet rows (the reference) and wall time."""
    rows, took = local_demo(cluster, "local", str(tmp_path_factory.mktemp("local") / "out"))
    print(f"local mode (local[2]): {took:.1f} s")
    return rows, took


def wait_committed(client, table: str, days: int, proc=None) -> None:
    """Until ``days`` days of ``table`` are committed; fails at once if ``proc`` (the
    submission) has exited."""

    def done() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"spark-demo exited {proc.returncode}: {proc.stdout.read()[-4000:]}")
        return committed_days(client, table) >= days

    wait_for(
        done,
        WAIT_S,
        f"{days} day(s) of {table} committed",
        interval_s=0.2,
        ignore=(*NOT_YET, ClientError),
    )


def test_the_demo_on_the_cluster_equals_local_mode(cluster, local):
    reference, local_s = local
    start = time.monotonic()
    proc = submit(cluster, "compose")
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(f"deploy/up.sh spark-demo: {took:.1f} s (local mode: {local_s:.1f} s)")
    assert "raftkv: http://raftkv1:2379, http://raftkv2:2379, http://raftkv3:2379" in proc.stdout
    with client_of(cluster) as client:
        check_pipeline(cluster, client, "compose", reference)
        ours, theirs = demo.read_tables(client, "compose"), demo.read_tables(client, "local")
        assert [(k, v) for k, v, _ in ours["rows"]] == [(k, v) for k, v, _ in theirs["rows"]]
        assert sorted(v for _, v, _ in ours["feed"]) == sorted(v for _, v, _ in theirs["feed"])


def test_leader_killed_mid_run(cluster, local):
    reference, _ = local
    table = "leaderkill"
    with client_of(cluster) as client:
        proc = submit(cluster, table, background=True)
        try:
            wait_committed(client, table, 1, proc)
            leader = cluster.leader()
            cluster.docker_run("kill", cluster.containers[leader])
            t0 = time.monotonic()
            others = [s for s in SERVICES if s != leader]
            wait_for(
                lambda: cluster.leader(among=others) != leader,
                WAIT_S,
                "a new leader among the others",
                interval_s=0.2,
                ignore=NOT_YET,
            )
            print(f"leader killed: a new leader after {time.monotonic() - t0:.1f} s")
            cluster.docker_run("start", cluster.containers[leader])
            rc, out = finish(proc)
            print(f"leader killed: the run finished {time.monotonic() - t0:.1f} s after")
        finally:
            proc.kill()
        assert rc == 0, out[-4000:]
        cluster.wait_healthy()
        check_pipeline(cluster, client, table, reference)


def test_driver_killed_and_the_job_resubmitted(cluster, local):
    reference, _ = local
    table = "driverkill"
    with client_of(cluster) as client:
        proc = submit(cluster, table, background=True)
        try:
            wait_committed(client, table, 1, proc)
            drivers = wait_for(lambda: driver_containers(cluster), 60, "the driver's container")
            cluster.docker_run("kill", *drivers)
            rc, out = finish(proc)
        finally:
            proc.kill()
        assert rc != 0, "the killed driver's spark-demo exited 0"
        assert committed_days(client, table) < 3, "the run was over before the kill"
        t0 = time.monotonic()
        again = submit(cluster, table)
        print(f"driver killed: the resubmitted run took {time.monotonic() - t0:.1f} s")
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
        assert "already committed" in again.stdout
        check_pipeline(cluster, client, table, reference)


def test_a_driver_frozen_past_its_lease_is_fenced_out_and_publishes_nothing(cluster, local):
    reference, _ = local
    table = "zombie"
    # One core per application: the frozen driver's executors keep theirs, the second
    # driver gets the other one.
    one_core = "--conf spark.cores.max=1"
    with client_of(cluster) as client:
        first = submit(cluster, table, background=True, submit_args=one_core)
        try:
            wait_committed(client, table, 1, first)
            drivers = wait_for(lambda: driver_containers(cluster), 60, "the driver's container")
            cluster.pause(*drivers)
            t0 = time.monotonic()
            second = submit(cluster, table, submit_args=one_core)
            print(f"driver frozen: the second driver's run took {time.monotonic() - t0:.1f} s")
            assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
            cluster.docker_run("unpause", *drivers)
            t0 = time.monotonic()
            rc, out = finish(first)
            print(f"driver frozen: thawed, it exited {rc} after {time.monotonic() - t0:.1f} s")
        finally:
            first.kill()
        assert rc != 0, f"the fenced-out driver exited 0:\n{out[-4000:]}"
        assert "FencedOutError" in out or "lock lost" in out, out[-4000:]
        tokens = [e.json()["token"] for e in CommitLog(client, table).history()]
        first_token = tokens[0]
        # the first driver's days, then only the second's: nothing of the first after it
        taken_over = tokens.index(next(t for t in tokens if t != first_token))
        assert set(tokens[taken_over:]) == {tokens[-1]} != {first_token}, tokens
        check_pipeline(cluster, client, table, reference, debris_tokens=(first_token,))


def test_a_worker_cut_from_the_network_and_restored(cluster, local):
    reference, _ = local
    table = "workercut"
    network = f"{cluster.project}_raftkv"
    worker = cluster.containers["spark-worker1"]
    # An executor that stops answering is given up after spark.network.timeout (120 s by
    # default); 20 s keeps the test short, and its tasks run again on the other worker.
    fast_loss = (
        "--conf spark.network.timeout=20s --conf spark.network.timeoutInterval=5s "
        "--conf spark.executor.heartbeatInterval=2s"
    )
    with client_of(cluster) as client:
        proc = submit(cluster, table, background=True, submit_args=fast_loss)
        try:
            wait_committed(client, table, 1, proc)
            cluster.docker_run("network", "disconnect", network, worker)
            t0 = time.monotonic()
            try:
                wait_committed(client, table, 2, proc)  # the run goes on without it
                print(f"worker cut: a day committed without it {time.monotonic() - t0:.1f} s after")
            finally:
                cluster.docker_run(
                    "network", "connect", "--alias", "spark-worker1", network, worker
                )
            rc, out = finish(proc)
        finally:
            proc.kill()
        assert rc == 0, out[-4000:]
        check_pipeline(cluster, client, table, reference)


def archive_lag(cluster) -> list:
    """Every member's archive lag in entries (None where a member does not answer)."""
    return [((cluster.status(s) or {}).get("archive") or {}).get("lag_entries") for s in SERVICES]


def test_the_archive_s3_stopped_for_a_while(cluster, local):
    reference, _ = local
    table = "s3stop"
    s3 = cluster.containers["s3"]
    with client_of(cluster) as client:
        proc = submit(cluster, table, background=True)
        try:
            wait_committed(client, table, 1, proc)
            cluster.pause(s3)  # frozen: moto keeps its objects in memory
            try:
                # the members cannot archive: their lag grows while the run writes
                wait_for(
                    lambda: max(lag or 0 for lag in archive_lag(cluster)) > 0,
                    WAIT_S,
                    "an archive lag",
                    interval_s=0.2,
                    ignore=NOT_YET,
                )
                wait_committed(client, table, 2, proc)
                print(f"S3 frozen: lag {archive_lag(cluster)}, a day committed meanwhile")
            finally:
                cluster.docker_run("unpause", s3)
            t0 = time.monotonic()
            rc, out = finish(proc)
            print(f"S3 frozen: the run finished {time.monotonic() - t0:.1f} s after the thaw")
        finally:
            proc.kill()
        assert rc == 0, out[-4000:]
        check_pipeline(cluster, client, table, reference)
        t0 = time.monotonic()
        wait_for(
            lambda: archive_lag(cluster) == [0, 0, 0],
            WAIT_S,
            "every member's archive caught up",
            interval_s=0.5,
            ignore=NOT_YET,
        )
        print(f"S3 frozen: every archive caught up {time.monotonic() - t0:.1f} s after the run")


# What the first driver of the member-cut test said about how it ended (printed).
FIRST_DRIVER_WORDS = ("lock lost", "FencedOutError", "ConnectionFailedError", "demo:", "day ")


def test_a_member_cut_from_the_clients_but_not_its_peers(cluster, local):
    reference, _ = local
    table = "membercut"
    member = cluster.leader()  # the leader: its peers keep hearing it, its clients do not
    url = f"http://{member}:2379"
    # One core per application, as for the frozen driver: both drivers get an executor.
    one_core = "--conf spark.cores.max=1"
    with client_of(cluster) as client, logs_on_failure(cluster):
        # The first driver and its executors know only this member, as a job configured
        # with one endpoint (or behind the same cut) would.
        first = Output(
            submit(cluster, table, "--endpoints", url, background=True, submit_args=one_core)
        )
        second = None
        try:
            wait_committed(client, table, 1, first.proc)
            assert reachable(cluster, "spark-worker1", f"{url}/health")
            cut(cluster, member)
            t0 = time.monotonic()
            try:
                assert not reachable(cluster, "spark-worker1", f"{url}/health")
                assert not reachable(cluster, "spark-master", f"{url}/health")
                second = Output(submit(cluster, table, background=True, submit_args=one_core))
                wait_committed(client, table, 2, second.proc)  # through the two others
                print(
                    f"member cut: the second driver committed a day {time.monotonic() - t0:.1f} s in"
                )
                # Not cut from its peers: the member applies what the others commit.
                day2 = CommitLog(client, table).get(1)
                assert day2 is not None
                wait_for(
                    lambda: status_inside(cluster, member)["revision"] >= day2.revision,
                    WAIT_S,
                    f"{member} applying revision {day2.revision} while cut",
                    interval_s=0.5,
                    ignore=NOT_YET,
                )
                inside = status_inside(cluster, member)
                print(
                    f"member cut: {member} inside: is_leader {inside.get('is_leader')}, "
                    f"revision {inside['revision']}"
                )
            finally:
                heal(cluster, member)
            t1 = time.monotonic()
            rc2, out2 = second.finish()
            print(
                f"member cut: healed; the second driver finished {time.monotonic() - t1:.1f} s later"
            )
            rc1, out1 = first.finish()
            why = [x for x in first.lines if any(w in x for w in FIRST_DRIVER_WORDS)]
            print(f"member cut: the first driver exited {rc1}:\n" + "\n".join(why[:12]))
        finally:
            first.proc.kill()
            if second is not None:
                second.proc.kill()
        assert rc2 == 0, out2[-6000:]
        assert rc1 != 0, (
            f"the driver that could reach only the cut member exited 0:\n{out1[-6000:]}"
        )
        assert "lock lost" in out1 or "FencedOutError" in out1, out1[-6000:]
        tokens = [e.json()["token"] for e in CommitLog(client, table).history()]
        first_token = tokens[0]
        taken_over = tokens.index(next(t for t in tokens if t != first_token))
        assert set(tokens[taken_over:]) == {tokens[-1]} != {first_token}, tokens
        cluster.wait_healthy()
        check_pipeline(cluster, client, table, reference, debris_tokens=(first_token,))


COLD_KEYS = 40
COLD_TXNS = 400  # of 5 puts each: 2,000 events in 400 revisions


def test_the_archive_s3_stopped_while_a_feed_reads_cold_history(cluster):
    t = "coldfeed"
    src, out = f"cold/{t}/src/", f"cold/{t}/feed/"
    s3 = "s3"
    with client_of(cluster) as client, logs_on_failure(cluster):
        start = client.put(f"cold/{t}/start", "x").revision + 1
        events: dict[int, list[tuple[str, str]]] = {}
        for i in range(COLD_TXNS):
            puts = [(f"k{(i * 5 + j) % COLD_KEYS:03d}", f"v{i}.{j}") for j in range(5)]
            res = client.txn(Txn().then(*(Op.put(src + k, v) for k, v in puts)))
            events[res.revision] = puts
        # Everything written so far leaves the store: only the archive has it now.
        client.compact(max(events))
        wait_for(
            lambda: archive_lag(cluster) == [0, 0, 0],
            WAIT_S,
            "every member's archive caught up",
            interval_s=0.5,
            ignore=NOT_YET,
        )
        app = Output(
            submit_app(
                cluster,
                "tests/deploy/spark_cold_feed_app.py",
                "--endpoints",
                "http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379",
                "--prefix",
                src,
                "--out",
                out,
                "--checkpoint",
                f"/data/{t}/checkpoint",
                "--starting-revision",
                str(start),
                "--archive-url",
                "s3://raftkv-archive/compose",
                "--max-revisions",
                "20",
            )
        )
        total = sum(len(p) for p in events.values())

        def delivered() -> int:
            if app.proc.poll() is not None:
                raise RuntimeError(f"the feed exited {app.proc.returncode}:\n{app.text()}")
            return client.range(out, prefix=True, count_only=True).count

        try:
            wait_for(
                lambda: delivered() > 0,
                WAIT_S,
                "the first cold batches",
                interval_s=0.2,
                ignore=NOT_YET,
            )
            cut(cluster, s3)
            t0 = time.monotonic()
            try:
                got = delivered()
                assert got < total, "the feed was done before S3 went away"
                # S3 stays away until the query has failed on it, and failed again once
                # restarted from its checkpoint
                wait_for(
                    lambda: app.has("feed: restart 2 from the checkpoint"),
                    WAIT_S,
                    "the feed failing on S3",
                    interval_s=0.5,
                )
                print(
                    f"S3 away: {got}/{total} events delivered; the query had failed twice {time.monotonic() - t0:.1f} s after"
                )
            finally:
                heal(cluster, s3)
            t1 = time.monotonic()
            rc, text = app.finish()
            print(
                f"S3 back: the feed caught up {time.monotonic() - t1:.1f} s later:\n"
                + "\n".join(x for x in text.splitlines() if x.startswith("feed:"))
            )
        finally:
            app.proc.kill()
        assert rc == 0, text[-6000:]
        restarts = re.search(r"feed: caught up after (\d+) restart", text)
        assert restarts and int(restarts.group(1)) >= 2, text[-6000:]
        kvs = client.range(out, prefix=True).kvs
        want = {f"{out}{rev:012d}/{k}": v for rev, puts in events.items() for k, v in puts}
        got_kvs = {kv.key.decode(): kv.value.decode() for kv in kvs}
        assert got_kvs == want, "an event missing or extra"
        assert all(kv.version == 1 for kv in kvs), "an event delivered twice"
        # In order: a feed key of a later source revision was never written before one of an
        # earlier revision (chunks of one txn share a revision).
        by_source = sorted(kvs, key=lambda kv: kv.key)
        creates = [kv.create_revision for kv in by_source]
        assert creates == sorted(creates), "events delivered out of revision order"
