"""Drive deploy/docker-compose.yml from tests through ``deploy/up.sh``, the users' command.

Every compose invocation goes through ``deploy/up.sh`` (which picks ``docker compose`` or
``docker-compose``), so the tests take the path ``make compose-up`` takes: ``up.sh up``
chooses the base image (a local ``python:3.11-slim``, else a pull, else the offline base
image ``raftkv-base:bookworm`` built by ``deploy/build-base-image.sh`` plus the wheelhouse of
``deploy/build-wheelhouse.sh`` and ``PIP_INSTALL_ARGS=--no-index``), builds the image (layers
cached by the engine, replaced images removed), runs ``up -d --no-build`` and waits until
every member's ``/health`` answers 200.

``compose_cluster(docker, image)`` is a context manager: ``up.sh up`` under a unique project
name (``COMPOSE_PROJECT_NAME=raftkvtest<pid>x<hex>``) with free host ports, checks (bounded
polls) that every member is healthy, yields a ``ComposeCluster`` and always ends with ``down
-v`` (containers, network and named volumes removed). If the block raised, the members' logs
are printed first. ``remove_stale_projects`` takes down projects of test runs that died before
their cleanup.

Environment: ``RAFTKV_TEST_BASE_IMAGE`` names an existing base image to use instead
(``RAFTKV_BASE_IMAGE`` for up.sh). Without Docker or Compose, or without a way to get a base
image (no registry, not root for debootstrap), the tests skip locally and fail under
``RAFTKV_REQUIRE_EXTERNAL=1``; up.sh reports those cases with exit status 3.
"""

import contextlib
import json
import os
import re
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from kvserver.localcluster.launcher import free_ports
from tests.conftest import external_required, require_program
from tests.support.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
UP = ["bash", os.path.join(DEPLOY, "up.sh")]
UP_MISSING_PREREQUISITE = 3  # deploy/up.sh's exit status for "cannot run here"
REGISTRY_BASE_IMAGE = "python:3.11-slim"
OFFLINE_BASE_IMAGE = "raftkv-base:bookworm"
APP_IMAGE = "raftkv:pytest"
SERVICES = ("raftkv1", "raftkv2", "raftkv3")
PROJECT_PREFIX = "raftkvtest"  # + <pid of the test run> + "x" + random hex
BUILD_TIMEOUT_S = 1200
UP_TIMEOUT_S = 120.0


def _unavailable(reason: str):
    if external_required():
        pytest.fail(f"{reason} (RAFTKV_REQUIRE_EXTERNAL=1: .ci/run should have provided it)")
    pytest.skip(reason)


def docker_command() -> str:
    docker = require_program("docker", "Docker Engine")
    probe = subprocess.run(
        [docker, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        _unavailable(f"the Docker daemon does not answer: {probe.stderr.strip()[:200]}")
    return docker


def run(
    cmd: list[str], timeout_s: float = 120, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode == UP_MISSING_PREREQUISITE and cmd[:2] == UP:
        _unavailable(f"deploy/up.sh cannot run here: {proc.stderr.strip()[-300:]}")
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


FREEZE_RETRY_S = 60.0


def pause(docker: str, *containers: str, timeout_s: float = FREEZE_RETRY_S) -> None:
    """``docker pause`` each container, trying again while the freezer cannot freeze it.

    runc freezes a container's cgroup and polls until every task is frozen. A busy task (a
    JVM's hundred threads on a loaded machine) can miss runc's short window: runc thaws the
    cgroup again and the daemon answers "unable to freeze". The container is then running
    as before, so another try is safe; any other error, or no success in ``timeout_s``,
    fails the test.
    """
    for container in containers:
        deadline = time.monotonic() + timeout_s
        while True:
            proc = run([docker, "pause", container], timeout_s=timeout_s, check=False)
            if proc.returncode == 0 or "is already paused" in proc.stderr:
                break
            if "unable to freeze" not in proc.stderr or time.monotonic() > deadline:
                raise AssertionError(
                    f"docker pause {container} exited {proc.returncode}: {proc.stderr[-2000:]}"
                )
            time.sleep(0.5)  # let the busy tasks reach a point the freezer can stop them at


def _image_exists(docker: str, tag: str) -> bool:
    return run([docker, "image", "inspect", tag], check=False).returncode == 0


def base_image_env(docker: str) -> dict[str, str]:
    """The environment that makes up.sh use RAFTKV_TEST_BASE_IMAGE, or nothing; skips when
    up.sh would need to build the offline base image and cannot (not root)."""
    base = os.environ.get("RAFTKV_TEST_BASE_IMAGE", "")
    if base:
        if not _image_exists(docker, base):
            _unavailable(f"RAFTKV_TEST_BASE_IMAGE={base} is not a local image")
        return {"RAFTKV_BASE_IMAGE": base}
    if (
        os.geteuid() != 0
        and not _image_exists(docker, REGISTRY_BASE_IMAGE)
        and not _image_exists(docker, OFFLINE_BASE_IMAGE)
    ):
        # up.sh would try a pull and then sudo debootstrap: no password prompts in tests.
        _unavailable(
            f"neither {REGISTRY_BASE_IMAGE} nor {OFFLINE_BASE_IMAGE} is a local "
            "image, and building the offline one (debootstrap) needs root"
        )
    return {}


def remove_stale_projects(docker: str) -> None:
    """``down -v`` compose projects left by test runs whose process is gone (a run that was
    killed before its cleanup), so their containers stop holding ports and CPU."""
    proc = run(
        [
            docker,
            "ps",
            "-a",
            "--filter",
            "label=com.docker.compose.project",
            "--format",
            '{{.Label "com.docker.compose.project"}}',
        ],
        check=False,
    )
    for project in sorted(set(proc.stdout.split())):
        match = re.fullmatch(rf"{PROJECT_PREFIX}(\d+)x[0-9a-f]+", project)
        if not match or _alive(int(match.group(1))):
            continue
        run(
            [*UP, "down", "-v", "--remove-orphans", "-t", "5"],
            check=False,
            env={**os.environ, "RAFTKV_IMAGE": APP_IMAGE, "COMPOSE_PROJECT_NAME": project},
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    timeout_s: float = 5.0,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# Containers and the daemon answer slowly and fail transiently (connection refused, a JSON
# line not written yet): waits poll every POLL_S and treat these errors as "not yet".
POLL_S = 0.2
NOT_YET = (OSError, AssertionError, ValueError)


@dataclass
class ComposeCluster:
    docker: str
    project: str
    env: dict[str, str]
    urls: dict[str, str]  # service -> http://127.0.0.1:<published port>
    containers: dict[str, str] = field(default_factory=dict)  # service -> container id
    acked: dict[str, str] = field(default_factory=dict)  # every acknowledged write, by tests
    ssl_context: ssl.SSLContext | None = None  # the TLS profile: trusts its CA

    def compose_run(
        self, *args: str, timeout_s: float = 180, check: bool = True
    ) -> subprocess.CompletedProcess:
        """``deploy/up.sh ARGS`` (a compose command) in this cluster's project."""
        return run([*UP, *args], timeout_s=timeout_s, env=self.env, check=check)

    def docker_run(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return run([self.docker, *args], timeout_s=timeout_s)

    def pause(self, *containers: str) -> None:
        """Freeze the containers (the cgroup freezer); see :func:`pause`."""
        pause(self.docker, *containers)

    def inspect(self, service: str, template: str) -> str:
        return self.docker_run("inspect", "-f", template, self.containers[service]).stdout.strip()

    def status(self, service: str, timeout_s: float = 2.0) -> dict | None:
        try:
            code, body = http(
                "GET",
                self.urls[service] + "/v1/status",
                timeout_s=timeout_s,
                context=self.ssl_context,
            )
        except OSError:
            return None
        return json.loads(body) if code == 200 else None

    def healthy(self, service: str) -> bool:
        try:
            return (
                http(
                    "GET", self.urls[service] + "/health", timeout_s=2.0, context=self.ssl_context
                )[0]
                == 200
            )
        except OSError:
            return False

    def wait_healthy(self, services=SERVICES, timeout_s: float = UP_TIMEOUT_S) -> None:
        for service in services:
            wait_for(
                lambda s=service: self.healthy(s),
                timeout_s,
                f"{service} /health 200",
                interval_s=POLL_S,
                ignore=NOT_YET,
            )

    def leader(self, among=SERVICES, timeout_s: float = 60.0) -> str:
        """The service name of the leader that every member in ``among`` agrees on."""

        def agreed():
            statuses = [self.status(s) for s in among]
            if any(st is None or not st.get("leader") for st in statuses):
                return None
            leaders = {st["leader"] for st in statuses}
            if len(leaders) != 1:
                return None
            names = {m["id"]: m["name"] for m in statuses[0]["members"]}
            return names.get(leaders.pop())

        return wait_for(
            agreed,
            timeout_s,
            f"one leader agreed by {', '.join(among)}",
            interval_s=POLL_S,
            ignore=NOT_YET,
        )

    def logs(self) -> str:
        proc = self.compose_run("logs", "--no-color", "--tail", "200", check=False)
        return proc.stdout + proc.stderr


@contextlib.contextmanager
def compose_cluster(
    docker: str,
    image: str,
    extra_env: dict[str, str] | None = None,
    tls_dir: str | None = None,
    taken_ports: frozenset[int] = frozenset(),
):
    """``deploy/up.sh up`` (build, start, wait healthy) as a unique project; ``down -v`` at
    the end. Yields the cluster and how long ``up.sh up`` took (seconds). With ``tls_dir``:
    the TLS profile (``RAFTKV_TLS=1``, certificates made by up.sh in ``tls_dir``), https
    URLs, and ``ssl_context`` trusting ``tls_dir/ca.pem`` once up.sh has made it."""
    project = f"{PROJECT_PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
    # ``taken_ports``: ports the caller picked for the project's other services. The kernel
    # may hand a port it just released out again, and Docker would then refuse to publish
    # one port twice.
    ports = free_ports(len(SERVICES))
    for _ in range(100):
        if not taken_ports.intersection(ports):
            break
        ports = free_ports(len(SERVICES))
    env = {
        **os.environ,
        **(extra_env or {}),
        "RAFTKV_IMAGE": image,
        "RAFTKV_PUBLISH_ADDR": "127.0.0.1",
        "RAFTKV_CLUSTER_TOKEN": project,
        "COMPOSE_PROJECT_NAME": project,
        "RAFTKV_UP_TIMEOUT_S": str(int(UP_TIMEOUT_S)),
    }
    scheme = "http"
    if tls_dir is not None:
        env.update(RAFTKV_TLS="1", RAFTKV_TLS_DIR=tls_dir)
        scheme = "https"
    urls = {}
    for service, port in zip(SERVICES, ports, strict=True):
        env[f"{service.upper()}_CLIENT_PORT"] = str(port)
        urls[service] = f"{scheme}://127.0.0.1:{port}"
    cluster = ComposeCluster(docker, project, env, urls)
    ok = False
    try:
        start = time.monotonic()
        proc = cluster.compose_run("up", timeout_s=BUILD_TIMEOUT_S)
        up_s = time.monotonic() - start
        if tls_dir is not None:
            cluster.ssl_context = ssl.create_default_context(cafile=os.path.join(tls_dir, "ca.pem"))
        print(f"deploy/up.sh up: {up_s:.1f} s\n{proc.stderr[-2000:]}")
        for service in SERVICES:
            cid = cluster.compose_run("ps", "-q", service).stdout.strip()
            assert cid, f"compose created no container for {service}"
            cluster.containers[service] = cid
        cluster.wait_healthy()  # up.sh waited too; this checks it did
        yield cluster, up_s
        ok = True
    finally:
        if not ok:
            print(f"--- logs of compose project {project} ---\n{cluster.logs()}")
        cluster.compose_run("down", "-v", "--remove-orphans", "-t", "10", check=False)
