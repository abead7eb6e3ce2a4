"""``raftkv restore --to-time T`` and ``--archive-retention`` with a real member (slow).

* to-time: phase A is written and archived (the manifest's commit reaches the member's
  commit index), T is taken, phase B overwrites and deletes keys; restoring to T gives
  exactly the state after phase A; a T before anything was archived is refused by name.
* retention: with ``--snapshot-count 40 --archive-retention 2`` the manifest keeps the two
  newest snapshots, every object it dropped is deleted from the store (nothing orphaned, no
  temporaries), a restore of the latest point equals the live state, and a revision older
  than the oldest kept snapshot is still restored from the log (its one segment, which
  retention must keep). Dropping whole segments is covered in-process (test_archive_unit):
  ``raftkv serve`` has no flag for small segments.
"""

from __future__ import annotations

import os
import time

import pytest

from kvserver.archive.manifest import Manifest
from kvserver.client import Client, Op, Txn
from kvserver.mvcc.store import WRITE_STEP_KEYS
from tests.archive.helpers import cli, read_data_dir, state_at
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def _manifests(root) -> list[Manifest]:
    return [Manifest.from_json(p.read_bytes(), str(p)) for p in root.rglob("manifest.json")]


def _restore(url: str, data_dir: str, *point: str):
    return cli(
        "restore",
        "--from",
        url,
        *point,
        "--data-dir",
        data_dir,
        "--name",
        "solo",
        "--initial-cluster",
        "solo=http://127.0.0.1:1",
    )


def test_restore_to_time(make_cluster, tmp_path):
    root = tmp_path / "archive"
    url = f"file://{root}"
    before_anything = time.time() - 3600
    c = make_cluster(1, extra_args=["--archive-url", url, "--archive-interval", "100"])
    with Client(c.endpoints) as cl:
        for i in range(60):
            cl.put(f"k/{i:02d}", f"a{i}")
        state_a = state_at(cl)
        commit_a = cl.status().raft_index
        wait_for(
            lambda: any(m.commit >= commit_a for m in _manifests(root)),
            60,
            f"the archive reaching commit {commit_a}",
        )
        t = time.time()
        # the archive's timeline is stamped with the WAL's modification time: make sure
        # phase B's writes land strictly after T even on a coarse clock
        wait_for(lambda: time.time() > t + 0.05, 5, "the clock to move past T")
        for i in range(0, 60, 3):
            cl.put(f"k/{i:02d}", f"b{i}")
        cl.delete("k/01")
        cl.put("k/new", "b")
        state_b = state_at(cl)
        commit_b = cl.status().raft_index
        wait_for(
            lambda: any(m.commit >= commit_b for m in _manifests(root)),
            60,
            f"the archive reaching commit {commit_b}",
        )
    c.stop()
    assert state_a != state_b
    r = _restore(url, str(tmp_path / "at-t"), "--to-time", f"{t:.3f}")
    assert r.returncode == 0, r.stderr
    assert read_data_dir(str(tmp_path / "at-t")) == state_a
    r = _restore(url, str(tmp_path / "latest"), "--latest")
    assert r.returncode == 0, r.stderr
    assert read_data_dir(str(tmp_path / "latest")) == state_b
    r = _restore(url, str(tmp_path / "too-early"), "--to-time", f"{before_anything:.3f}")
    assert r.returncode == 1
    assert "at or before time" in r.stderr
    assert not os.path.exists(tmp_path / "too-early" / "member")


def test_restore_replays_a_prefix_delete_of_many_keys_whole(make_cluster, tmp_path):
    """A delete of more keys than one apply step holds (the member applies it in steps) is
    replayed whole by a restore, not skipped."""
    root = tmp_path / "archive"
    url = f"file://{root}"
    c = make_cluster(1, extra_args=["--archive-url", url, "--archive-interval", "100"])
    many = WRITE_STEP_KEYS + 300
    with Client(c.endpoints) as cl:
        for start in range(0, many, 127):
            stop = min(start + 127, many)
            cl.txn(Txn().then(*(Op.put(f"big/{i:05d}", "v") for i in range(start, stop))))
        cl.put("kept", "1")
        deleted = cl.delete("big/", prefix=True)
        assert deleted.deleted == many
        cl.put("after", "2")
        live = state_at(cl)
        commit = cl.status().raft_index
        wait_for(
            lambda: any(m.commit >= commit for m in _manifests(root)),
            60,
            f"the archive reaching commit {commit}",
        )
    c.stop()
    r = _restore(url, str(tmp_path / "latest"), "--latest")
    assert r.returncode == 0, r.stderr
    restored = read_data_dir(str(tmp_path / "latest"))
    assert restored == live
    assert sorted(restored) == [b"after", b"kept"]


def test_archive_retention_keeps_two_snapshots_and_deletes_the_rest(make_cluster, tmp_path):
    root = tmp_path / "archive"
    url = f"file://{root}"
    c = make_cluster(
        1,
        extra_args=[
            "--archive-url",
            url,
            "--archive-interval",
            "100",
            "--snapshot-count",
            "40",
            "--archive-retention",
            "2",
        ],
    )
    with Client(c.endpoints) as cl:
        first_rev = cl.put("k/first", "x").header.revision
        for i in range(300):
            cl.put(f"k/{i % 50:02d}", f"v{i}")
        live = state_at(cl)
        commit = cl.status().raft_index

        def settled() -> bool:
            ms = _manifests(root)
            return bool(ms) and ms[0].commit >= commit and len(ms[0].snapshots) == 2

        wait_for(settled, 60, "the archive reaching the last commit with two snapshots")
    c.stop()
    (m,) = _manifests(root)
    assert len(m.snapshots) == 2
    stored = {
        str(p.relative_to(root / m.member_prefix))
        for p in (root / m.member_prefix).rglob("*")
        if p.is_file()
    }
    assert stored == m.objects() | {"manifest.json"}, "objects the manifest dropped remain"
    r = _restore(url, str(tmp_path / "latest"), "--latest")
    assert r.returncode == 0, r.stderr
    assert read_data_dir(str(tmp_path / "latest")) == live
    # The member's one 64 MB segment holds the whole log, so retention cannot drop any of
    # it and the oldest revision stays restorable by replay from the empty state.
    (seg,) = m.segments
    assert seg.seq == 0
    r = _restore(url, str(tmp_path / "old"), "--to-revision", str(first_rev))
    assert r.returncode == 0, r.stderr
    assert read_data_dir(str(tmp_path / "old")) == {b"k/first": (b"x", first_rev, first_rev, 1)}
