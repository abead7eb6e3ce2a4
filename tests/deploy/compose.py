"""Drive deploy/docker-compose.yml from tests: build the images, bring up three members.

``build_images()`` makes everything the compose file needs without pulling from a registry:
the Debian base image (``deploy/build-base-image.sh``, debootstrap, cached by tag), the
wheelhouse (``deploy/build-wheelhouse.sh`` with this interpreter, cached by a stamp) and the
raftkv image from ``deploy/Dockerfile`` with ``--build-arg BASE_IMAGE=<base>`` and
``PIP_INSTALL_ARGS=--no-index`` (layers cached by the engine). It returns the image tag and
how long each step took.

``compose_cluster(docker, compose, image)`` is a context manager: ``up -d --no-build`` under
a unique project name (``raftkvtest<pid>x<hex>``) with free host ports, waits (bounded polls)
until every member's ``/health`` answers 200, yields a ``ComposeCluster``, and always ends with
``down -v`` (containers, network and named volumes removed). If the block raised, the members'
logs are printed first. ``remove_stale_projects`` takes down projects of test runs that died
before their cleanup. Images replaced by a rebuild are removed, so reruns do not pile them up.

Environment: ``RAFTKV_TEST_BASE_IMAGE`` names an existing base image to use instead of
building one (e.g. ``python:3.11-slim`` where it can be pulled).
Without Docker (or Compose, or debootstrap for the base image) the tests skip locally and
fail under ``RAFTKV_REQUIRE_EXTERNAL=1``.
"""

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from kvserver.cluster import free_ports
from tests.conftest import external_required, require_program

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
COMPOSE_FILE = os.path.join(DEPLOY, "docker-compose.yml")
BASE_IMAGE = "raftkv-base:bookworm"
APP_IMAGE = "raftkv:pytest"
BUILD_STAGE_IMAGE = "raftkv:pytest-build"
SERVICES = ("raftkv1", "raftkv2", "raftkv3")
PROJECT_PREFIX = "raftkvtest"      # + <pid of the test run> + "x" + random hex
BUILD_TIMEOUT_S = 1200
UP_TIMEOUT_S = 120.0


def _unavailable(reason: str):
    if external_required():
        pytest.fail(f"{reason} (RAFTKV_REQUIRE_EXTERNAL=1: .ci/run should have provided it)")
    pytest.skip(reason)


def docker_command() -> str:
    docker = require_program("docker", "Docker Engine")
    probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        _unavailable(f"the Docker daemon does not answer: {probe.stderr.strip()[:200]}")
    return docker


def compose_command(docker: str) -> list[str]:
    """``docker compose`` (v2 plugin) when present, else ``docker-compose`` (v1)."""
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        return [docker, "compose"]
    return [require_program("docker-compose", "Docker Compose (v2 plugin or docker-compose)")]


def run(cmd: list[str], timeout_s: float = 120, env: dict | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def _image_exists(docker: str, tag: str) -> bool:
    return run([docker, "image", "inspect", tag], check=False).returncode == 0


def build_images(docker: str) -> tuple[str, dict[str, float]]:
    durations: dict[str, float] = {}
    base = os.environ.get("RAFTKV_TEST_BASE_IMAGE", "")
    if base:
        if not _image_exists(docker, base):
            _unavailable(f"RAFTKV_TEST_BASE_IMAGE={base} is not a local image")
    else:
        base = BASE_IMAGE
        if not _image_exists(docker, base):
            require_program("debootstrap", "Debian package debootstrap, to build the base image")
            if os.geteuid() != 0:
                _unavailable("building the base image with debootstrap needs root")
        start = time.monotonic()
        run(["bash", os.path.join(DEPLOY, "build-base-image.sh"), base],
            timeout_s=BUILD_TIMEOUT_S)
        durations["base_image_s"] = time.monotonic() - start

    start = time.monotonic()
    run(["bash", os.path.join(DEPLOY, "build-wheelhouse.sh")], timeout_s=BUILD_TIMEOUT_S,
        env={**os.environ, "PYTHON": sys.executable})
    durations["wheelhouse_s"] = time.monotonic() - start

    start = time.monotonic()
    # The build stage gets a tag of its own so that the image it replaces can be removed
    # below; untagged, every source change would leave one more behind.
    for tag, target in ((BUILD_STAGE_IMAGE, ["--target", "build"]), (APP_IMAGE, [])):
        previous = _image_id(docker, tag)
        run([docker, "build", "-f", os.path.join(DEPLOY, "Dockerfile"), *target,
             "--build-arg", f"BASE_IMAGE={base}", "--build-arg", "PIP_INSTALL_ARGS=--no-index",
             "-t", tag, "."], timeout_s=BUILD_TIMEOUT_S)
        if previous and previous != _image_id(docker, tag):
            # Only layers the new image no longer shares go; the build cache stays.
            run([docker, "image", "rm", previous], check=False)
    durations["app_image_s"] = time.monotonic() - start
    return APP_IMAGE, durations


def _image_id(docker: str, tag: str) -> str:
    proc = run([docker, "image", "inspect", "-f", "{{.Id}}", tag], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def remove_stale_projects(docker: str, compose: list[str]) -> None:
    """``down -v`` compose projects left by test runs whose process is gone (a run that was
    killed before its cleanup), so their containers stop holding ports and CPU."""
    proc = run([docker, "ps", "-a", "--filter", "label=com.docker.compose.project",
                "--format", '{{.Label "com.docker.compose.project"}}'], check=False)
    for project in sorted(set(proc.stdout.split())):
        match = re.fullmatch(rf"{PROJECT_PREFIX}(\d+)x[0-9a-f]+", project)
        if not match or _alive(int(match.group(1))):
            continue
        run([*compose, "-p", project, "-f", COMPOSE_FILE, "down", "-v", "--remove-orphans",
             "-t", "5"], check=False, env={**os.environ, "RAFTKV_IMAGE": APP_IMAGE})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def http(method: str, url: str, body: bytes | None = None,
         timeout_s: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, AssertionError, ValueError) as exc:
            value, last_exc = None, exc
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}"
                         + (f" (last error: {last_exc!r})" if last_exc else ""))


@dataclass
class ComposeCluster:
    docker: str
    compose: list[str]
    project: str
    env: dict[str, str]
    urls: dict[str, str]                       # service -> http://127.0.0.1:<published port>
    containers: dict[str, str] = field(default_factory=dict)  # service -> container id
    acked: dict[str, str] = field(default_factory=dict)  # every acknowledged write, by tests

    def compose_run(self, *args: str, timeout_s: float = 180,
                    check: bool = True) -> subprocess.CompletedProcess:
        return run([*self.compose, "-p", self.project, "-f", COMPOSE_FILE, *args],
                   timeout_s=timeout_s, env=self.env, check=check)

    def docker_run(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return run([self.docker, *args], timeout_s=timeout_s)

    def inspect(self, service: str, template: str) -> str:
        return self.docker_run("inspect", "-f", template,
                               self.containers[service]).stdout.strip()

    def status(self, service: str, timeout_s: float = 2.0) -> dict | None:
        try:
            code, body = http("GET", self.urls[service] + "/v1/status", timeout_s=timeout_s)
        except OSError:
            return None
        return json.loads(body) if code == 200 else None

    def healthy(self, service: str) -> bool:
        try:
            return http("GET", self.urls[service] + "/health", timeout_s=2.0)[0] == 200
        except OSError:
            return False

    def wait_healthy(self, services=SERVICES, timeout_s: float = UP_TIMEOUT_S) -> None:
        for service in services:
            wait_for(lambda s=service: self.healthy(s), timeout_s, f"{service} /health 200")

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
        return wait_for(agreed, timeout_s, f"one leader agreed by {', '.join(among)}")

    def logs(self) -> str:
        proc = self.compose_run("logs", "--no-color", "--tail", "200", check=False)
        return proc.stdout + proc.stderr


@contextlib.contextmanager
def compose_cluster(docker: str, compose: list[str], image: str):
    project = f"{PROJECT_PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
    ports = free_ports(len(SERVICES))
    env = {**os.environ, "RAFTKV_IMAGE": image, "RAFTKV_PUBLISH_ADDR": "127.0.0.1",
           "RAFTKV_CLUSTER_TOKEN": project}
    urls = {}
    for service, port in zip(SERVICES, ports, strict=True):
        env[f"{service.upper()}_CLIENT_PORT"] = str(port)
        urls[service] = f"http://127.0.0.1:{port}"
    cluster = ComposeCluster(docker, compose, project, env, urls)
    ok = False
    try:
        cluster.compose_run("up", "-d", "--no-build")
        for service in SERVICES:
            cid = cluster.compose_run("ps", "-q", service).stdout.strip()
            assert cid, f"compose created no container for {service}"
            cluster.containers[service] = cid
        cluster.wait_healthy()
        yield cluster
        ok = True
    finally:
        if not ok:
            print(f"--- logs of compose project {project} ---\n{cluster.logs()}")
        cluster.compose_run("down", "-v", "--remove-orphans", "-t", "10", check=False)
