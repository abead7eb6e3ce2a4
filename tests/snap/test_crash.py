"""Crash consistency of save_snap: a temp file is never visible as a snapshot.

A real process dies — at each step of a save (os._exit injected before the write, half way
through it, before the file fsync, before the rename, before the directory fsync) and by
SIGKILL at random moments of a save loop — and a fresh Snapshotter afterwards finds only
complete snapshots, at least the last acknowledged one, and nothing newer than the save in
flight. (Power loss relies on the order fsync file -> rename -> fsync directory, which a
process kill cannot test.)
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import raftpb
from snap import Snapshotter, read_snap
from snap.names import parse_snap_name

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRASH_EXIT_CODE = 17


def _spawn(code: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


# Each crash point replaces one os function, in the child, by one that dies on its n-th call
# (after optionally doing part of the work), while the second save (index 6) runs.
CRASH_CHILD = """
    import os, sys
    import raftpb
    from snap import Snapshotter
    point = sys.argv[2]
    def snapshot(index):
        return raftpb.Snapshot(data=b"v%d" % index * 100_000,
                               metadata=raftpb.SnapshotMetadata(index=index, term=1))
    s = Snapshotter(sys.argv[1])
    s.save_snap(snapshot(5))
    real = {"write": os.write, "fsync": os.fsync}
    calls = {"n": 0}
    def dying(name, on_call, partial=False):
        def f(*args):
            calls["n"] += 1
            if calls["n"] == on_call:
                if partial:
                    fd, data = args
                    real["write"](fd, data[: len(data) // 2])
                os._exit(CRASH_EXIT_CODE)
            return real[name](*args) if name in real else None
        return f
    if point == "before-write":
        os.write = dying("write", 1)
    elif point == "mid-write":
        os.write = dying("write", 2, partial=True)
    elif point == "before-file-fsync":
        os.fsync = dying("fsync", 1)
    elif point == "before-rename":
        os.replace = dying("replace", 1)
    elif point == "before-dir-fsync":
        os.fsync = dying("fsync", 2)
    s.save_snap(snapshot(6))
    """.replace("CRASH_EXIT_CODE", str(CRASH_EXIT_CODE))

OLD = "0000000000000001-0000000000000005.snap"
NEW = "0000000000000001-0000000000000006.snap"


@pytest.mark.parametrize(
    "point", ["before-write", "mid-write", "before-file-fsync", "before-rename", "before-dir-fsync"]
)
def test_crash_at_each_step_of_a_save(tmp_path, point):
    child = _spawn(CRASH_CHILD, str(tmp_path), point)
    _, err = child.communicate(timeout=60)
    assert child.returncode == CRASH_EXIT_CODE, err
    left = sorted(os.listdir(tmp_path))
    if point == "before-dir-fsync":
        # renamed but save_snap never returned: the file is whole, and as its WAL record was
        # never written, the loader does not use it
        assert left == [OLD, NEW]
        assert read_snap(str(tmp_path / NEW)).metadata.index == 6
    else:
        assert left == [OLD, NEW + ".tmp"]  # never under the final name
    s = Snapshotter(tmp_path)  # opening removes the temp leftover
    assert NEW + ".tmp" not in os.listdir(tmp_path)
    wal = [raftpb.WalSnapshot(index=0, term=0), raftpb.WalSnapshot(index=5, term=1)]
    assert s.load_newest_available(wal).metadata.index == 5
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".broken")]


SAVE_LOOP = """
    import sys
    import raftpb
    from snap import Snapshotter
    s = Snapshotter(sys.argv[1])
    index = 0
    while True:
        index += 1
        payload = (b"%08d" % index) * 65536         # 512 KiB: a save spans several syscalls
        s.save_snap(raftpb.Snapshot(data=payload,
                                    metadata=raftpb.SnapshotMetadata(index=index, term=1)))
        s.purge(keep=3)
        print(index, flush=True)                    # acknowledged: saved durably
    """


def test_sigkill_during_a_save_loop_never_exposes_a_partial_snapshot(tmp_path):
    rng = random.Random(20240611)
    for round_no in range(6):
        d = tmp_path / f"round{round_no}"
        child = _spawn(SAVE_LOOP, str(d))
        acked = 0
        kill_after = rng.randint(1, 12)
        for line in child.stdout:
            acked = int(line)
            if acked >= kill_after:
                # a random crash point inside the next save or purge (not a wait for a result)
                time.sleep(rng.uniform(0, 0.01))
                child.send_signal(signal.SIGKILL)
                break
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        for line in child.stdout:  # acks the child printed that we had not read yet
            acked = int(line)
        child.stdout.close()
        child.stderr.close()

        names = [parse_snap_name(n) for n in os.listdir(d) if n.endswith(".snap")]
        assert names, "the acknowledged snapshots vanished"
        for name in names:  # every visible .snap file is whole and says what its name says
            snapshot = read_snap(str(d / name.file_name))
            assert snapshot.data == (b"%08d" % name.index) * 65536
        newest = max(n.index for n in names)
        assert acked <= newest <= acked + 1  # nothing beyond the save in flight
        assert Snapshotter(d).load().metadata.index == newest
        assert not [n for n in os.listdir(d) if n.endswith((".tmp", ".broken"))]
