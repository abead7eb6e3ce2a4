"""A restarted member never answers a local (serializable) read, or opens a watch, from a
state older than the one it had before it stopped.

Its store lives in memory and is rebuilt from the snapshot and the WAL: answering at once,
for the first moments after a restart it would answer serializable reads at revision 1 (an
empty store) and then at every revision of the replay, going back in time (the chaos suite
saw "revision 2423 after 26465"). etcd's store is on disk, so it never does; raftkv makes
those requests wait until the recovered log is applied again (or answers 503).
"""

import base64
import signal
import time

import pytest

from kvserver.client import Client, Op, Txn
from tests.cluster.harness import call, wait_healthy
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def _serializable_revision(url: str) -> int | None:
    try:
        status, body = call(
            url,
            "/v3/kv/range",
            {
                "key": base64.b64encode(b"r/").decode(),
                "range_end": base64.b64encode(b"r0").decode(),
                "count_only": True,
                "serializable": True,
            },
            timeout_s=2.0,
        )
    except OSError:
        return None  # not listening yet
    if status != 200:
        assert status == 503, (status, body)  # "still replaying its log": a clean refusal
        return None
    return int(body["header"]["revision"])


def test_a_restarted_follower_never_serves_an_older_revision(make_cluster):
    c = make_cluster(3, extra_args=["--snapshot-count", "100000"])
    leader = wait_healthy(c)
    with Client(c.endpoints) as client:
        for start in range(0, 20_000, 100):  # a log long enough that replay takes a while
            client.txn(
                Txn().then(*[Op.put(f"r/{i:06d}", "x" * 32) for i in range(start, start + 100)])
            )
        before = client.put("r/last", "x").header.revision
    follower = next(n for n in c.nodes if n is not leader)
    wait_for(
        lambda: (_serializable_revision(follower.client_url) or 0) >= before,
        30,
        "the follower to apply the last write",
    )
    c.kill(follower, signal.SIGKILL)
    c.start_node(follower)
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rev = _serializable_revision(follower.client_url)
        if rev is not None:
            seen.append(rev)
            if len(seen) >= 20:
                break
    assert seen, "the restarted follower never answered a serializable read"
    assert min(seen) >= before, f"served revision {min(seen)} after {before} before the restart"
    wait_healthy(c, timeout_s=60)
