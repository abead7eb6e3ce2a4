"""Helpers for tests that run real ``raftkv serve`` processes on loopback.

Plain urllib against the etcd-gateway JSON API, so failures of the client library do not hide
or cause failures here. Every wait is bounded and polls; nothing sleeps to hide a race.
"""

import base64
import json
import urllib.error
import urllib.request

from kvserver.bench.result import serving
from kvserver.localcluster.launcher import LocalCluster, NodeProcess
from tests.support.wait import wait_for

# Snapshots every 40 entries, keeping 5 after each and nothing more (no byte budget): a member
# that falls behind catches up through a snapshot, the path these tests want to exercise.
SNAPSHOT_OFTEN_ARGS = [
    "--snapshot-count",
    "40",
    "--snapshot-catchup-entries",
    "5",
    "--snapshot-catchup-bytes",
    "0",
]


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def call(
    url: str,
    path: str,
    body: dict | None = None,
    timeout_s: float = 5.0,
    headers: dict | None = None,
) -> tuple[int, dict]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(
        url + path,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def get_json(url: str, path: str, timeout_s: float = 2.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def put(url: str, key: str, value: str, **kw) -> int:
    """Put through the etcd gateway; returns the revision or raises AssertionError."""
    status, body = call(url, "/v3/kv/put", {"key": b64(key), "value": b64(value)}, **kw)
    if status != 200:
        raise AssertionError(f"put {key} via {url}: {status} {body}")
    return int(body["header"]["revision"])


def get(url: str, key: str, serializable: bool = False, **kw) -> str | None:
    status, body = call(url, "/v3/kv/range", {"key": b64(key), "serializable": serializable}, **kw)
    if status != 200:
        raise AssertionError(f"get {key} via {url}: {status} {body}")
    kvs = body.get("kvs", [])
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def get_prefix(url: str, prefix: str, serializable: bool = False) -> dict[str, str]:
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    status, body = call(
        url,
        "/v3/kv/range",
        {"key": b64(prefix), "range_end": b64(end), "serializable": serializable},
        timeout_s=10,
    )
    if status != 200:
        raise AssertionError(f"range {prefix} via {url}: {status} {body}")
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
        for kv in body.get("kvs", [])
    }


def status(node: NodeProcess) -> dict | None:
    try:
        code, body = get_json(node.client_url, "/v1/status", timeout_s=1.0)
    except OSError:
        return None
    return body if code == 200 else None


def leader_of(cluster: LocalCluster, among: list[NodeProcess] | None = None) -> NodeProcess | None:
    """The node that every live node (of ``among``) agrees is leader, if any."""
    nodes = [n for n in (among or cluster.nodes) if n.alive()]
    ids = set()
    by_id = {}
    for n in nodes:
        st = status(n)
        if st is None:
            return None
        ids.add(st["leader"])
        by_id[st["id"]] = n
    if len(ids) == 1:
        (lead,) = ids
        return by_id.get(lead)
    return None


# Three fresh processes import the server and elect a leader in a few seconds; on a loaded
# two-core CI machine (Docker builds, Spark, a browser beside them) it has taken over 20 s.
HEALTHY_TIMEOUT_S = 60.0


def wait_healthy(
    cluster: LocalCluster,
    timeout_s: float = HEALTHY_TIMEOUT_S,
    among: list[NodeProcess] | None = None,
) -> NodeProcess:
    def ready():
        for n in among or cluster.nodes:
            if not n.alive():
                raise AssertionError(f"{n.name} exited:\n{cluster.log_tail(n)}")
            if not serving(n.client_url):
                return None
        return leader_of(cluster, among)

    return wait_for(ready, timeout_s, "a healthy cluster with an agreed leader")


def get_json_safe(url: str, path: str) -> int:
    try:
        return get_json(url, path, timeout_s=1.0)[0]
    except OSError:
        return 0
