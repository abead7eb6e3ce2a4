"""The batching counters compare.py reads: MsgApps sent and the entries in them, and the
heartbeats (which also carry the rounds of linearizable reads)."""

import urllib.request

from kvserver.bench.runner import run
from kvserver.bench.workloads import BenchOptions
from kvserver.server.metrics import AppendCounter
from raft import Entry, Message, MessageType


def test_counts_only_append_messages_and_their_entries():
    sent = []
    c = AppendCounter()
    send = c.wrap(sent.extend)
    msgs = [
        Message(MessageType.MsgApp, to=2, frm=1, entries=(Entry(term=1, index=i),) * 1)
        for i in (1, 2)
    ]
    msgs.append(
        Message(
            MessageType.MsgApp,
            to=3,
            frm=1,
            entries=tuple(Entry(term=1, index=i) for i in (1, 2, 3)),
        )
    )
    msgs.append(Message(MessageType.MsgHeartbeat, to=2, frm=1))
    send(msgs)
    assert sent == msgs  # passed on unchanged
    assert c.stats() == {
        "raft_append_messages_sent": 3,
        "raft_append_entries_sent": 5,
        "raft_heartbeats_sent": 1,
    }


def scrape(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("raftkv_") and "{" not in line.split()[0]
    }


def test_a_loaded_leader_reports_entries_per_append_and_fsyncs(inproc_cluster):
    run(
        BenchOptions(
            op="put", endpoints=inproc_cluster.endpoints, clients=8, total=200, target_leader=True
        ).validate()
    )
    leader = next(u for u in inproc_cluster.endpoints if scrape(u)["raftkv_raft_is_leader"])
    m = scrape(leader)
    msgs = m["raftkv_raft_append_messages_sent_total"]
    entries = m["raftkv_raft_append_entries_sent_total"]
    # each of the 200 entries goes to both followers at least once
    assert entries >= 2 * 200 and msgs >= 1
    assert m["raftkv_wal_fsync_duration_seconds_count"] >= 1
