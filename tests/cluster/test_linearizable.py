"""A recorded concurrent history against three real processes, checked for linearizability,
while the leader is SIGKILLed and restarted.

Clients are threads, each sending puts (unique values) and linearizable gets over a few
keys to every node in turn. A request that fails or times out is recorded with an unknown
outcome (it may still have been applied); the checker (tests/lincheck, Wing–Gong/Lowe,
partitioned by key) must find a valid sequential order for every key.
"""

import base64
import random
import signal
import threading
import time

import pytest

from tests.cluster.harness import b64, call, leader_of, wait_healthy
from tests.lincheck import History, KvModel, assert_linearizable, kv
from tests.support.wait import wait_for


def client(cid: int, cluster, history: History, stop: threading.Event) -> None:
    rng = random.Random(cid)
    n = 0
    while not stop.is_set():
        n += 1
        nodes = [x for x in cluster.nodes if x.alive()]
        if not nodes:
            time.sleep(0.01)
            continue
        url = nodes[rng.randrange(len(nodes))].client_url
        key = f"lin/k{rng.randrange(4)}"
        try:
            if rng.random() < 0.5:
                value = f"{cid}-{n}"
                with history.record(cid, kv.put(key, value)) as rec:
                    code, body = call(
                        url, "/v3/kv/put", {"key": b64(key), "value": b64(value)}, timeout_s=2
                    )
                    if code != 200:
                        raise OSError(f"put answered {code}")
                    rec.ok(kv.put_ok(int(body["header"]["revision"])))
            else:
                with history.record(cid, kv.get(key)) as rec:
                    code, body = call(url, "/v3/kv/range", {"key": b64(key)}, timeout_s=2)
                    if code != 200:
                        raise OSError(f"get answered {code}")
                    kvs = body.get("kvs", [])
                    value = base64.b64decode(kvs[0]["value"]).decode() if kvs else None
                    rec.ok(kv.get_ok(value, int(kvs[0]["mod_revision"]) if kvs else None))
        except OSError:
            time.sleep(0.02)  # recorded as unknown outcome by `record`


@pytest.mark.slow
def test_history_with_leader_kill_and_restart_is_linearizable(make_cluster):
    cluster = make_cluster()
    history = History()
    stop = threading.Event()
    threads = [
        threading.Thread(target=client, args=(c, cluster, history, stop), daemon=True)
        for c in range(6)
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(history.operations()) >= 300, 30, "300 operations")
        for _ in range(2):
            lead = leader_of(cluster)
            assert lead is not None
            cluster.kill(lead, signal.SIGKILL)
            count = len(history.operations())
            wait_for(
                lambda c=count: len(history.operations()) >= c + 300,
                30,
                "operations to continue after the kill",
            )
            cluster.start_node(lead)
            wait_healthy(cluster)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    ops = history.operations()
    completed = sum(1 for op in ops if op.output is not None)
    assert completed >= 600, f"only {completed} operations completed"
    assert_linearizable(KvModel(), history)
