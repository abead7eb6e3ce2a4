"""Auto-compaction on a three-node raftkv of real processes (etcd's --auto-compaction-*).

The leader proposes the compaction through raft, so every member ends with the same compact
revision, and history below it is gone everywhere (a read there answers etcd's "required
revision has been compacted"), while the retained history stays readable. Intervals are
shortened with ``--auto-compaction-check-interval`` (revision mode) and a short period
(periodic mode); every wait polls with a deadline.
"""

import pytest

from tests.cluster.harness import b64, call, put, status
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

COMPACTED = "etcdserver: mvcc: required revision has been compacted"


def _compact_revisions(cluster) -> list[int | None]:
    return [(status(n) or {}).get("compact_revision") for n in cluster.nodes]


@pytest.mark.parametrize(
    "mode, retention, keep",
    [
        ("revision", "5", 5),  # keep the last 5 revisions
        ("periodic", "2s", 0),  # keep ~2 s: after writes stop, everything up to the last one
    ],
)
def test_history_is_compacted_on_every_member(make_cluster, mode, retention, keep):
    cluster = make_cluster(
        extra_args=[
            "--auto-compaction-mode",
            mode,
            "--auto-compaction-retention",
            retention,
            "--auto-compaction-check-interval",
            "200ms",
        ]
    )
    url = cluster.nodes[0].client_url
    last = 0
    for i in range(20):
        last = put(url, "ac/k", f"v{i}")
    target = last - keep

    wait_for(
        lambda: _compact_revisions(cluster) == [target] * 3,
        30,
        f"compact revision {target} on every member",
    )
    for node in cluster.nodes:
        code, body = call(
            node.client_url,
            "/v3/kv/range",
            {"key": b64("ac/k"), "revision": str(target - 1), "serializable": True},
        )
        assert (code, body.get("error")) == (400, COMPACTED), node.name
        code, body = call(
            node.client_url,
            "/v3/kv/range",
            {"key": b64("ac/k"), "revision": str(target), "serializable": True},
        )
        assert code == 200 and body["kvs"][0]["mod_revision"] == str(target), node.name
    # nothing else changed: the current value is the last write
    code, body = call(url, "/v3/kv/range", {"key": b64("ac/k")})
    assert code == 200 and body["kvs"][0]["mod_revision"] == str(last)


def test_disabled_by_default(make_cluster):
    cluster = make_cluster()
    url = cluster.nodes[0].client_url
    for i in range(5):
        put(url, "ac/d", str(i))
    code, body = call(url, "/v3/kv/range", {"key": b64("ac/d"), "revision": "2"})
    assert code == 200 and body["kvs"][0]["version"] == "1"
    assert _compact_revisions(cluster) == [-1] * 3
