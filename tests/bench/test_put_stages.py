"""The stage marks and the put-stage benchmark's matching, without a cluster.

- ``kvserver.stages`` writes nothing unless ``RAFTKV_STAGE_TRACE`` is set, and then every mark
  of the process, in order, when it exits;
- ``benchmarks.put_stages.put_stages`` takes each stage's first mark after the previous one,
  picks the follower whose acknowledgement came first, and the critical path's stages add up
  to what the client measured.
"""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.put_stages import CRITICAL, put_stages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(env: dict[str, str]) -> None:
    code = (
        "from kvserver import stages\nif stages.ON:\n    stages.mark('a', 3)\n    stages.mark('b')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)


def test_marks_are_written_only_when_asked(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAFTKV_STAGE_TRACE"}
    _run(env)
    assert list(tmp_path.iterdir()) == []
    _run({**env, "RAFTKV_STAGE_TRACE": str(tmp_path)})
    (written,) = tmp_path.iterdir()
    lines = [line.split() for line in written.read_text().splitlines()]
    assert [(stage, tag) for stage, tag, _ in lines] == [("a", "3"), ("b", "0")]
    assert int(lines[0][2]) <= int(lines[1][2])


def test_a_put_is_split_into_stages_that_add_up():
    leader = {
        "link.call_in": [20],
        "raft.propose": [30],
        "raft.append_sent": [40],
        "wal.written": [45],
        "wal.fsync_start": [50],
        "wal.fsync_end": [90],
        "wal.persisted": [95],
        "peer.ack_recv": [120, 130],
        "raft.committed": [125, 140],
        "apply.done": [150],
    }
    frontend = {"fe.call": [10], "fe.reply": [160]}
    disk = {"wal.written": [75], "wal.fsync_start": [80], "wal.fsync_end": [100]}
    slow = {"peer.append_recv": [70], "raft.ack_sent": [128], **disk}
    fast = {"peer.append_recv": [60], "raft.ack_sent": [110], **disk}
    got = put_stages((0, 200), leader, frontend, [slow, fast])
    assert got["to_follower"] == 20 and got["follower_disk"] == 50 and got["ack"] == 10
    assert (got["f_step"], got["f_hop"], got["f_fsync"], got["f_back"]) == (15, 5, 20, 10)
    assert got["quorum"] == 80 and got["leader_later"] == 0 and got["commit"] == 5
    assert sum(got[key] for key in CRITICAL) == got["total"] == 200
