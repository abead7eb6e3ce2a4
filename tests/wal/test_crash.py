"""Crash consistency: SIGKILL a process that is appending, at random moments, many times.

A child (crash_child.py) appends deterministic batches and prints ``ack j`` once batch j
is durable. The parent kills it at a random point (during writes, fsyncs, segment cuts,
file preparation), then opens the WAL (repairing a torn tail if there is one) and checks:
every acknowledged batch is there, in order, and nothing is invented: the recovered log
and hard state equal the state after some prefix of the records the child wrote, at or
after the last acknowledged batch. The next round continues from what was recovered.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import wal
from raftpb import HardState

from .crash_child import batches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEGMENT_BYTES = 32 * 1024


def recover(path):
    repaired = False
    while True:
        w = wal.open(path, segment_size_bytes=SEGMENT_BYTES, prepare_ahead=False)
        try:
            _, hs, ents = w.read_all()
            return hs, ents, repaired
        except wal.TornWriteError:
            assert not repaired, "repair did not leave a clean log"
        finally:
            w.close()
        assert wal.repair(path)
        repaired = True


def check_round(seed, round_no, log, hs, last_ack, last_sub, rec_hs, rec_log):
    """The recovered state must be one the child passed through after batch ``last_ack``."""
    last_index = log[-1].index if log else 0
    last_term = max(hs.term, log[-1].term if log else 0)
    gen = batches(seed, round_no, last_index, last_term, hs.commit)
    cur = list(log)
    cur_hs = hs

    def matches():
        return (
            cur_hs == rec_hs
            and len(cur) == len(rec_log)
            and (not cur or cur[-1] == rec_log[-1])
            and cur == rec_log
        )

    if last_ack < 0 and matches():
        return
    for j in range(last_sub + 1):
        b_hs, ents = next(gen)
        for e in ents:  # one record at a time: a crash can cut a batch between frames
            del cur[e.index - 1 :]
            cur.append(e)
            if j > last_ack and matches():
                return
        cur_hs = b_hs
        if j >= last_ack and matches():
            return
    raise AssertionError(
        f"round {round_no}: recovered log (last index "
        f"{rec_log[-1].index if rec_log else 0}, {rec_hs}) is not a state "
        f"the child passed through after ack {last_ack} (sub {last_sub})"
    )


def run_rounds(tmp_path, seed, rounds, modes=("save", "writer")):
    rng = random.Random(seed)
    path = str(tmp_path / "wal")
    env = dict(os.environ, PYTHONPATH=ROOT)
    log, hs = [], HardState()
    stats = {"repaired": 0, "acks": 0}
    for round_no in range(rounds):
        mode = modes[round_no % len(modes)]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.wal.crash_child",
                path,
                str(seed),
                str(round_no),
                mode,
                str(SEGMENT_BYTES),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        last_ack = last_sub = -1
        kill_after = rng.randint(1, 60)
        try:
            ready = proc.stdout.readline().split()
            assert ready[:1] == ["ready"], ready
            assert int(ready[1]) == (log[-1].index if log else 0)
            while True:
                line = proc.stdout.readline()
                assert line, f"child exited early with {proc.wait()}"
                kind, j = line.split()[:2]
                assert kind in ("sub", "ack"), line
                if kind == "sub":
                    last_sub = int(j)
                    continue
                assert int(j) == last_ack + 1, "acknowledgements out of order"
                last_ack = int(j)
                if last_ack >= kill_after:
                    time.sleep(rng.random() * 0.003)  # land anywhere in the next writes
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            rest = proc.communicate()[0]
        for line in rest.splitlines():  # acks printed before the kill landed count too
            kind, j = line.split()[:2]
            if kind == "sub":
                last_sub = max(last_sub, int(j))
            elif kind == "ack":
                assert int(j) == last_ack + 1
                last_ack = int(j)
        rec_hs, rec_log, repaired = recover(path)
        stats["repaired"] += repaired
        stats["acks"] += last_ack + 1
        check_round(seed, round_no, log, hs, last_ack, last_sub, rec_hs, rec_log)
        log, hs = rec_log, rec_hs
    assert wal.verify(path, allow_torn_tail=False) == hs
    return stats, log


def test_sigkill_while_appending_loses_no_acknowledged_entry(tmp_path):
    stats, log = run_rounds(tmp_path, seed=1, rounds=4)
    assert stats["acks"] > 4 and log


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_sigkill_while_appending_many_rounds(tmp_path, seed):
    stats, log = run_rounds(tmp_path, seed=seed, rounds=25)
    segments = [n for n in os.listdir(tmp_path / "wal") if n.endswith(".wal")]
    assert len(segments) > 3, "expected segment cuts across the rounds"


def test_the_checker_rejects_lost_and_invented_entries():
    """check_round itself must be able to fail (a test that cannot fail is a defect)."""
    from raftpb import Entry

    gen = batches(9, 0, 0, 0, 0)
    log, hs = [], HardState()
    for _ in range(4):
        b_hs, ents = next(gen)
        for e in ents:
            del log[e.index - 1 :]
            log.append(e)
        hs = b_hs
    assert log
    check_round(9, 0, [], HardState(), 3, 3, hs, log)
    with pytest.raises(AssertionError):
        check_round(9, 0, [], HardState(), 3, 3, hs, log[:-1])  # lost
    invented = log + [Entry(term=log[-1].term, index=log[-1].index + 1, data=b"?")]
    with pytest.raises(AssertionError):
        check_round(9, 0, [], HardState(), 3, 3, hs, invented)  # invented
    changed = log[:-1] + [Entry(term=log[-1].term, index=log[-1].index, data=b"?")]
    with pytest.raises(AssertionError):
        check_round(9, 0, [], HardState(), 3, 3, hs, changed)  # wrong entry
