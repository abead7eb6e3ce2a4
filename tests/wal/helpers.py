"""Shared helpers for the WAL tests: entries with checkable payloads, and a counting fsync."""

from __future__ import annotations

import hashlib
import os
import threading

from raftpb import Entry


def payload(index: int, term: int, size: int = 16) -> bytes:
    """Deterministic data for (index, term): a recovered entry can be checked byte for byte."""
    seed = hashlib.blake2b(f"{index}/{term}".encode(), digest_size=16).digest()
    return (seed * (size // 16 + 1))[:size]


def entries(first: int, last: int, term: int = 1, size: int = 16) -> list[Entry]:
    return [Entry(term=term, index=i, data=payload(i, term, size)) for i in range(first, last + 1)]


class CountingSync:
    """An injectable data-sync function: counts calls, can hold one call until released."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self.hold_next = False
        self.entered = threading.Event()  # set when a held sync is waiting
        self.release = threading.Event()
        self.fail_with: OSError | None = None

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.calls += 1
            hold, self.hold_next = self.hold_next, False
        if hold:
            self.entered.set()
            assert self.release.wait(30), "test never released the held fsync"
        fail = self.fail_with  # read after the hold: a test may arm it meanwhile
        if fail is not None:
            raise fail
        os.fdatasync(fd)


def segment_files(dir_path) -> list[str]:
    return sorted(n for n in os.listdir(dir_path) if n.endswith(".wal"))
