"""Child process of the crash-consistency test (test_crash.py): append until killed.

    python -m tests.wal.crash_child DIR SEED ROUND MODE SEGMENT_BYTES

Creates the WAL (round 0) or opens and reads it, then appends an endless deterministic
sequence of batches (``batches``: hard state + entries, with occasional rewrites of the
uncommitted tail, as a new leader causes). Before writing batch j it prints ``sub j``;
after batch j is durable it prints ``ack j``. MODE ``save`` uses WAL.save (one batch at a
time); ``writer`` pipelines up to 8 batches through the GroupCommitWriter.
"""

from __future__ import annotations

import os
import random
import sys
import threading

import wal
from raftpb import Entry, HardState

from .helpers import payload

MAX_INFLIGHT = 8


def batches(seed: int, round_no: int, last_index: int, last_term: int, commit: int):
    """Deterministic (hard_state, entries) batches continuing a log in that state."""
    rng = random.Random(f"{seed}/{round_no}")
    term = last_term + 1
    vote = rng.randint(1, 3)
    while True:
        start = last_index + 1
        if rng.random() < 0.15 and last_index > commit:
            start = rng.randint(commit + 1, last_index)  # a new leader rewrites the tail
            term += 1
        n = rng.randint(0, 12)
        ents = [
            Entry(term=term, index=start + i, data=payload(start + i, term, rng.randint(1, 400)))
            for i in range(n)
        ]
        if n:
            last_index = start + n - 1
        if rng.random() < 0.5:
            commit = rng.randint(commit, last_index)
        yield HardState(term=term, vote=vote, commit=commit), ents


def main(argv: list[str]) -> None:
    path, seed, round_no, mode, seg = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    if not os.path.exists(path):
        w = wal.create(path, b"crash-test", segment_size_bytes=seg)
        last_index = last_term = commit = 0
    else:
        w = wal.open(path, segment_size_bytes=seg)
        _, hs, ents = w.read_all()
        last_index = ents[-1].index if ents else 0
        last_term = max(hs.term, ents[-1].term if ents else 0)
        commit = hs.commit
    out = sys.stdout
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    say(f"ready {last_index} {commit}")
    gen = batches(seed, round_no, last_index, last_term, commit)
    if mode == "save":
        for j, (hs, ents) in enumerate(gen):
            say(f"sub {j}")
            w.save(hs, ents)
            say(f"ack {j}")
    else:
        writer = wal.GroupCommitWriter(w)
        slots = threading.BoundedSemaphore(MAX_INFLIGHT)
        for j, (hs, ents) in enumerate(gen):
            slots.acquire()

            def done(err, j=j):
                if err is None:
                    say(f"ack {j}")
                else:
                    say(f"error {j} {err!r}")
                slots.release()

            say(f"sub {j}")
            writer.submit(hs, ents, callback=done)


if __name__ == "__main__":
    main(sys.argv[1:])
