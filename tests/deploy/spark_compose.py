"""The compose ``spark`` profile from tests: the cluster, the demo submitted to it, and what a
finished pipeline must look like.

``spark_cluster(docker)`` is ``compose_cluster`` with ``RAFTKV_SPARK=1`` (the members, moto's
S3 server, a Spark standalone master and two workers; images tagged ``APP_IMAGE``, shared
with the other compose tests, and ``SPARK_IMAGE``) and free host ports for the Spark UI and
S3. ``submit(c, table, ...)`` runs ``deploy/up.sh spark-demo`` as a user does (or starts it,
``background=True``); its output goes to ``/data/<table>`` in the shared volume.
``submit_app`` starts ``deploy/up.sh spark-submit APP ARGS``; ``Output`` collects a running
submission's lines on a thread, so a test can wait for a line while the job goes on.
``clients_network``, ``cut``/``heal`` take a container off the clients' network (the
profile's ``raftkv``; members keep their own ``raftkv-peers``) and put it back under its
service name; ``status_inside`` asks a member for its status from inside its container,
which works while it is cut from the clients' network.
``check_pipeline`` asserts what every run must end with, faults or not:

- every day committed exactly once (commit-log versions 0..days-1, each key at version 1)
  and the run's state ``done``;
- the Parquet output equal to the reference rows and no staging directory left;
- the rows in raftkv one per (day, category), each the committed row's JSON;
- the feed: each row key has exactly as many feed keys (one per PUT event, ``@revision``)
  as it has versions, every feed key at version 1 (no event delivered twice, none lost),
  and the newest one holds the row's value.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time

from kvserver.client import Client
from kvserver.localcluster.launcher import free_ports
from kvserver.spark import demo
from kvserver.spark.commitlog import CommitLog
from tests.deploy.compose import APP_IMAGE, ROOT, UP, base_image_env, compose_cluster

SPARK_IMAGE = "raftkv-spark:pytest"
CFG = {"days": 3, "events_per_day": 3000, "seed": 5}
DEMO_TIMEOUT_S = 600
# A driver's lock lease (s): short, so a fenced-out driver's successor does not wait long.
TTL_S = 5

READ_OUTPUT = r"""
import json, os, sys
import pyarrow.parquet as pq
out = sys.argv[1]
rows = []
for name in sorted(os.listdir(out)):
    if name.startswith("day="):
        for f in sorted(os.listdir(os.path.join(out, name))):
            if f.endswith(".parquet"):
                table = pq.read_table(os.path.join(out, name, f))
                rows += [list(r.values()) for r in table.to_pylist()]
staging = os.path.join(out, "_staging")
print(json.dumps({"rows": sorted(rows), "staging": sorted(os.listdir(staging))}))
"""


@contextlib.contextmanager
def spark_cluster(docker: str):
    ui, s3 = free_ports(2)
    env = {
        **base_image_env(docker),
        "RAFTKV_SPARK": "1",
        "RAFTKV_SPARK_IMAGE": SPARK_IMAGE,
        "RAFTKV_SPARK_UI_PORT": str(ui),
        "RAFTKV_S3_PORT": str(s3),
    }
    with compose_cluster(docker, APP_IMAGE, env, taken_ports=frozenset((ui, s3))) as (c, up_s):
        print(f"deploy/up.sh up --spark (build + start + healthy + workers): {up_s:.1f} s")
        for service in ("s3", "spark-master", "spark-worker1", "spark-worker2"):
            c.containers[service] = c.compose_run("ps", "-q", service).stdout.strip()
        c.env["S3_URL"] = f"http://127.0.0.1:{s3}"
        yield c


def client_of(c) -> Client:
    return Client(list(c.urls.values()), timeout_s=30)


def demo_args(table: str, *extra: str, out: str = "") -> list[str]:
    return [
        "--table",
        table,
        "--out",
        out or f"/data/{table}",
        "--days",
        str(CFG["days"]),
        "--events-per-day",
        str(CFG["events_per_day"]),
        "--seed",
        str(CFG["seed"]),
        "--ttl",
        str(TTL_S),
        *extra,
    ]


def submit(c, table: str, *extra: str, background: bool = False, submit_args: str = ""):
    """``deploy/up.sh spark-demo`` for ``table``: the CompletedProcess (check=False), or the
    running Popen with ``background``."""
    env = {**c.env, "RAFTKV_SPARK_SUBMIT_ARGS": submit_args}
    cmd = [*UP, "spark-demo", *demo_args(table, *extra)]
    if background:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )


def finish(proc: subprocess.Popen, timeout_s: float = DEMO_TIMEOUT_S) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out


def cluster_output(c, table: str) -> dict:
    proc = c.compose_run(
        "run", "--rm", "-T", "spark-driver", "python", "-c", READ_OUTPUT, f"/data/{table}"
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def local_demo(c, table: str, out_dir: str) -> tuple[list, float]:
    """The same pipeline in local mode (local[2] in a process of this venv) against the same
    members (their published ports): its Parquet rows and wall time."""
    start = time.monotonic()
    proc = subprocess.run(
        [
            os.path.join(ROOT, ".venv", "bin", "python")
            if os.path.exists(os.path.join(ROOT, ".venv", "bin", "python"))
            else "python3",
            "-m",
            "kvserver.spark.demo",
            "--endpoints",
            ",".join(c.urls.values()),
            "--master",
            "local[2]",
            *demo_args(table, out=out_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [list(r) for r in demo.read_output(out_dir)], took


def committed_days(client: Client, table: str) -> int:
    return len(list(CommitLog(client, table).history()))


def feed_by_row(tables: dict) -> dict[str, list[tuple[str, str, int]]]:
    """The feed's keys grouped by row key: row key -> [(revision, value, version)]."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    for key, value, version in tables["feed"]:
        row, _, revision = key.rpartition("@")
        out.setdefault(row, []).append((revision, value, version))
    return out


def check_pipeline(
    c, client: Client, table: str, reference: list, debris_tokens: tuple[int, ...] = ()
) -> None:
    """See the module docstring; ``debris_tokens``: fenced-out drivers whose staging
    directories (never published) may remain."""
    cfg = demo.DemoConfig(table=table, **CFG)
    log = CommitLog(client, table)
    entries = list(log.history())
    assert [e.version for e in entries] == list(range(cfg.days)), "a day missing or twice"
    for e in entries:
        assert client.get(log.key(e.version)).version == 1, f"version {e.version} rewritten"
        assert e.json()["day"] == cfg.day(e.version)
    state = json.loads(client.get(demo.state_key(table)).value)
    assert state["status"] == "done" and state["days_done"] == cfg.days, state
    out = cluster_output(c, table)
    assert out["rows"] == reference
    assert [d for d in out["staging"] if int(d.rpartition(".t")[2]) not in debris_tokens] == []
    tables = demo.read_tables(client, table)
    want = {f"{r[0]}/{r[1]}" for r in reference}
    assert {k for k, _, _ in tables["rows"]} == want
    for _, value, _ in tables["rows"]:
        row = json.loads(value)
        assert [row[f] for f in ("day", "category", "events", "users", "revenue_cents")] in (
            reference
        )
    feed = feed_by_row(tables)
    assert set(feed) == want
    for key, value, version in tables["rows"]:
        events = feed[key]
        assert all(v == 1 for _, _, v in events), f"{key}: an event delivered twice: {events}"
        assert len(events) == version, f"{key}: {version} PUTs, {len(events)} in the feed"
        assert max(events)[1] == value


def driver_containers(c) -> list[str]:
    """The running one-off driver containers (``compose run`` of spark-driver)."""
    proc = c.docker_run(
        "ps",
        "-q",
        "--filter",
        f"label=com.docker.compose.project={c.project}",
        "--filter",
        "label=com.docker.compose.service=spark-driver",
    )
    return proc.stdout.split()


def submit_app(c, app: str, *args: str, submit_args: str = "") -> subprocess.Popen:
    """``deploy/up.sh spark-submit APP ARGS``, started (stdout and stderr in one pipe)."""
    return subprocess.Popen(
        [*UP, "spark-submit", app, *args],
        cwd=ROOT,
        env={**c.env, "RAFTKV_SPARK_SUBMIT_ARGS": submit_args},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class Output:
    """The lines of a running submission, read on a thread (its pipe never fills)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        """Whether a line holds ``text``; raises once the process has exited without one."""
        if any(text in line for line in self.lines):
            return True
        if self.proc.poll() is not None:
            self._thread.join(timeout=10)
            if any(text in line for line in self.lines):
                return True
            raise RuntimeError(
                f"exited {self.proc.returncode} without a line holding {text!r}:\n{self.text()}"
            )
        return False

    def finish(self, timeout_s: float = DEMO_TIMEOUT_S) -> tuple[int, str]:
        """Its exit status and its whole output (the tail alone would miss a line printed
        before a long stack trace)."""
        rc = self.proc.wait(timeout=timeout_s)
        self._thread.join(timeout=30)
        return rc, "\n".join(self.lines)

    def text(self, tail: int = 6000) -> str:
        """The last ``tail`` characters of its output, for a failure's message."""
        return "\n".join(self.lines)[-tail:]


def clients_network(c) -> str:
    """The profile's clients' network (members, S3, Spark); the members also have their own
    ``raftkv-peers``."""
    return f"{c.project}_raftkv"


def cut(c, service: str) -> None:
    c.docker_run("network", "disconnect", clients_network(c), c.containers[service])


def heal(c, service: str) -> None:
    """Back on the clients' network, under its service name (the alias compose gave it)."""
    c.docker_run(
        "network", "connect", "--alias", service, clients_network(c), c.containers[service]
    )


STATUS_INSIDE = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:2379/v1/status', timeout=5).read().decode())"
)


def status_inside(c, member: str) -> dict:
    """``/v1/status`` of ``member`` asked from inside its container."""
    proc = c.docker_run("exec", c.containers[member], "/opt/raftkv/bin/python", "-c", STATUS_INSIDE)
    return json.loads(proc.stdout)


def reachable(c, src: str, url: str) -> bool:
    """Whether ``url`` answers from the container of service ``src`` (curl, 3 s)."""
    proc = subprocess.run(
        [c.docker, "exec", c.containers[src], "curl", "-s", "-o", "/dev/null", "-m", "3", url],
        capture_output=True,
        timeout=30,
    )
    return proc.returncode == 0


@contextlib.contextmanager
def logs_on_failure(c):
    """The profile's logs (every service's last lines) printed when the block fails: the
    module's cluster outlives a failed test, so ``compose_cluster`` would not print them."""
    try:
        yield
    except BaseException:
        print(f"--- logs of compose project {c.project} ---\n{c.logs()}")
        raise
