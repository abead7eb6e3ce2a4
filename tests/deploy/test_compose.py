"""deploy/: the shipped Dockerfile and docker-compose.yml run a working three-member cluster.

The cluster is built and started by ``deploy/up.sh up``, the command behind ``make
compose-up`` (offline base image and wheelhouse when no registry answers; see
tests/deploy/compose.py), with ``deploy/docker-compose.yml`` unchanged but for environment
variables (image tag, free host ports, a unique project name and cluster token).
The tests share one cluster and run in file order; each leaves all three members healthy,
and every write they saw acknowledged is remembered in ``acked`` and must stay readable to the
end, across a killed leader, a frozen follower, a crashed member restarted by the restart
policy and a stop/start of the whole cluster (named volumes keep the data).

The properties are the deployment's share of the durability promise: a minority down or frozen
does not stop writes, an acknowledged write is never lost, a member that comes back catches
up. Every wait is a bounded poll; nothing asserts on timing.
"""

import json
import os
import signal
from urllib.parse import quote

import pytest

from tests.deploy.compose import (
    APP_IMAGE,
    NOT_YET,
    POLL_S,
    SERVICES,
    base_image_env,
    compose_cluster,
    docker_command,
    http,
    remove_stale_projects,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.external, pytest.mark.timeout(1800)]

WRITES_WHILE_DOWN = 20


@pytest.fixture(scope="module")
def cluster():
    docker = docker_command()
    remove_stale_projects(docker)  # before the build: they hold the old image
    with compose_cluster(docker, APP_IMAGE, base_image_env(docker)) as (c, up_s):
        print(f"deploy/up.sh up (build + start + healthy): {up_s:.1f} s")
        yield c


def put(url: str, key: str, value: str, timeout_s: float = 5.0) -> bool:
    """True when the write was acknowledged (200); False on an error or no answer."""
    try:
        code, _ = http(
            "PUT", f"{url}/v1/kv/{quote(key, safe='')}", value.encode(), timeout_s=timeout_s
        )
    except OSError:
        return False
    return code == 200


def get(url: str, key: str, serializable: bool = False) -> str | None:
    query = "?serializable=true" if serializable else ""
    code, body = http("GET", f"{url}/v1/kv/{quote(key, safe='')}{query}")
    if code == 404:
        return None
    assert code == 200, f"GET {key} via {url}: {code} {body[:200]!r}"
    return body.decode()


def everything(url: str, serializable: bool) -> dict[str, str]:
    query = "prefix=true" + ("&serializable=true" if serializable else "")
    code, body = http("GET", f"{url}/v1/kv/?{query}", timeout_s=10.0)
    assert code == 200, f"GET every key via {url}: {code} {body[:200]!r}"
    return {kv["key"]: kv["value"] for kv in json.loads(body)}


def has_all(url: str, expected: dict[str, str], serializable: bool) -> bool:
    found = everything(url, serializable)
    return all(found.get(k) == v for k, v in expected.items())


def put_acked(c, service: str, key: str, value: str) -> None:
    assert put(c.urls[service], key, value), f"PUT {key} via {service} was not acknowledged"
    c.acked[key] = value


def write_until(c, services, prefix: str, count: int, timeout_s: float = 60.0) -> int:
    """Write ``count`` acknowledged keys, round-robin over ``services``, retrying refusals
    (no leader yet, timeouts) until ``timeout_s``. Returns how many attempts went unanswered
    or were refused (those writes may or may not have happened; only acked ones are kept)."""
    failures, done = 0, 0

    def step():
        nonlocal failures, done
        service = services[(done + failures) % len(services)]
        key, value = f"{prefix}/{done:03d}", f"{prefix}-{done}-via-{service}"
        if put(c.urls[service], key, value, timeout_s=3.0):
            c.acked[key] = value
            done += 1
        else:
            failures += 1
        return done >= count

    wait_for(
        step,
        timeout_s,
        f"{count} acknowledged writes via {', '.join(services)}",
        interval_s=0.05,
        ignore=NOT_YET,
    )
    return failures


def test_image_runs_unprivileged_with_a_named_data_volume_and_a_healthcheck(cluster):
    c = cluster
    for service in SERVICES:
        assert c.inspect(service, "{{.Config.User}}") == "raftkv"
        assert c.docker_run("exec", c.containers[service], "id", "-u").stdout.strip() == "2379"
        mounts = json.loads(c.inspect(service, "{{json .Mounts}}"))
        data = [m for m in mounts if m["Destination"] == "/var/lib/raftkv"]
        assert len(data) == 1 and data[0]["Type"] == "volume", mounts
        assert data[0]["Name"].endswith(f"{service}-data"), data[0]["Name"]
        assert c.inspect(service, "{{.HostConfig.RestartPolicy.Name}}") == "unless-stopped"
        # The image's HEALTHCHECK (deploy/healthcheck.py against /health) reports healthy.
        wait_for(
            lambda s=service: c.inspect(s, "{{.State.Health.Status}}") == "healthy",
            90,
            f"docker health of {service} to be healthy",
            interval_s=POLL_S,
            ignore=NOT_YET,
        )


def test_every_member_accepts_writes_and_serves_linearizable_reads(cluster):
    c = cluster
    for service in SERVICES:
        put_acked(c, service, f"hello/{service}", f"written via {service}")
    for service in SERVICES:
        for key, value in c.acked.items():
            assert get(c.urls[service], key) == value, (service, key)
    # All three members report the same leader and the configured three-member cluster.
    leader = c.leader()
    members = {m["name"] for m in c.status(leader)["members"]}
    assert members == set(SERVICES)


def test_killed_leader_writes_continue_and_it_catches_up_after_restart(cluster):
    c = cluster
    leader = c.leader()
    survivors = [s for s in SERVICES if s != leader]
    c.docker_run("kill", c.containers[leader])
    # A `docker kill` is a manual stop: the restart policy leaves the member down.
    wait_for(
        lambda: c.inspect(leader, "{{.State.Running}}") == "false",
        30,
        f"{leader}'s container to stop",
        interval_s=POLL_S,
        ignore=NOT_YET,
    )

    write_until(c, survivors, "after-leader-kill", WRITES_WHILE_DOWN)
    new_leader = c.leader(among=survivors)
    assert new_leader in survivors
    for service in survivors:  # linearizable reads: every acknowledged write, on both
        assert has_all(c.urls[service], c.acked, serializable=False), service

    c.docker_run("start", c.containers[leader])
    c.wait_healthy([leader])
    # Its own state machine (a local read) catches up with every acknowledged write.
    wait_for(
        lambda: has_all(c.urls[leader], c.acked, serializable=True),
        60,
        f"{leader} to apply every acknowledged write",
        interval_s=POLL_S,
        ignore=NOT_YET,
    )
    assert has_all(c.urls[leader], c.acked, serializable=False)


def test_paused_follower_writes_continue_and_it_catches_up_when_resumed(cluster):
    c = cluster
    leader = c.leader()
    follower = next(s for s in SERVICES if s != leader)
    others = [s for s in SERVICES if s != follower]
    c.pause(c.containers[follower])  # every process frozen (cgroup freezer)
    try:
        assert c.inspect(follower, "{{.State.Paused}}") == "true"
        write_until(c, others, "while-paused", WRITES_WHILE_DOWN)
        for service in others:
            assert has_all(c.urls[service], c.acked, serializable=False), service
    finally:
        c.docker_run("unpause", c.containers[follower])
    wait_for(
        lambda: has_all(c.urls[follower], c.acked, serializable=True),
        60,
        f"{follower} to apply every acknowledged write after unpause",
        interval_s=POLL_S,
        ignore=NOT_YET,
    )
    c.wait_healthy()
    assert c.leader() in SERVICES


def test_crashed_member_is_restarted_by_the_restart_policy(cluster):
    c = cluster
    leader = c.leader()
    victim = next(s for s in SERVICES if s != leader)
    before = int(c.inspect(victim, "{{.RestartCount}}"))
    pid = int(c.inspect(victim, "{{.State.Pid}}"))
    try:
        os.kill(pid, signal.SIGKILL)  # a crash, not a `docker stop`/`kill`: policy applies
    except (ProcessLookupError, PermissionError) as exc:
        pytest.skip(
            f"the engine's processes are not visible from here (remote or rootless Docker): {exc}"
        )
    wait_for(
        lambda: int(c.inspect(victim, "{{.RestartCount}}")) > before,
        60,
        f"docker to restart {victim}",
        interval_s=POLL_S,
        ignore=NOT_YET,
    )
    put_acked(c, leader, "after-crash", "still here")
    c.wait_healthy([victim])
    wait_for(
        lambda: has_all(c.urls[victim], c.acked, serializable=True),
        60,
        f"{victim} to apply every acknowledged write after its restart",
        interval_s=POLL_S,
        ignore=NOT_YET,
    )


def test_whole_cluster_stop_and_start_keeps_every_acknowledged_write(cluster):
    c = cluster
    assert len(c.acked) >= 2 * WRITES_WHILE_DOWN
    c.compose_run("stop", "-t", "20")
    for service in SERVICES:
        assert c.inspect(service, "{{.State.Running}}") == "false"
    c.compose_run("start")
    c.wait_healthy()
    for service in SERVICES:
        assert has_all(c.urls[service], c.acked, serializable=False), service
    put_acked(c, SERVICES[0], "after-restart", "ok")
    assert get(c.urls[SERVICES[2]], "after-restart") == "ok"
