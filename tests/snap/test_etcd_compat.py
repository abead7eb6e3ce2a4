"""Real etcd compatibility: .snap files written by etcd v3.4 load with our Snapshotter.

etcd is started on loopback with ``--snapshot-count 100``, ~300 keys are written through its
JSON gateway so that it takes a few snapshots, then it is stopped and ``member/snap/*.snap``
is read. Beyond decoding with every CRC checked, re-saving what we read reproduces etcd's
files byte for byte, so the two implementations agree on the encoding in both directions.
(etcd's WAL is read by wal/'s tests; here ``load()`` ignores the WAL.)
"""

import json
import os
import shutil

import pytest

from snap import Snapshotter, read_snap
from snap.names import parse_snap_name
from tests.etcd_process import etcd_process

pytestmark = [pytest.mark.external, pytest.mark.slow]

KEYS_TO_WRITE = 300


def _write_through_etcd(root: str) -> str:
    """Start etcd with a small snapshot count, write keys, stop it; return its data dir."""
    with etcd_process(root, name="compat", snapshot_count=100) as etcd:
        for i in range(KEYS_TO_WRITE):
            etcd.put(f"/compat/key-{i:04d}", f"value {i} " * 8)
    return etcd.data_dir


def test_snap_files_written_by_etcd_load_and_reencode_identically(tmp_path):
    data_dir = _write_through_etcd(str(tmp_path))

    etcd_snap_dir = os.path.join(data_dir, "member", "snap")
    snap_dir = str(tmp_path / "copy")
    shutil.copytree(etcd_snap_dir, snap_dir)  # work on a copy: loading may rename files
    etcd_files = sorted(n for n in os.listdir(snap_dir) if n.endswith(".snap"))
    assert len(etcd_files) >= 2, f"expected several snapshots, got {os.listdir(snap_dir)}"
    assert "db" in os.listdir(snap_dir)  # etcd's bolt file lives here too and is ignored

    snapper = Snapshotter(snap_dir)
    assert snapper.snap_names() == sorted(etcd_files, reverse=True)
    newest = snapper.load()
    newest_name = parse_snap_name(snapper.snap_names()[0])
    assert (newest.metadata.term, newest.metadata.index) == (newest_name.term, newest_name.index)
    assert newest.metadata.index >= 200  # etcd snapshots every 100 applied entries
    assert len(newest.metadata.conf_state.voters) == 1 and newest.metadata.conf_state.voters[0]
    json.loads(newest.data)  # etcd 3.4 puts its v2 store, as JSON, in the snapshot data

    resaved = Snapshotter(tmp_path / "resaved")
    for name in etcd_files:
        original = os.path.join(snap_dir, name)
        snapshot = read_snap(original)
        with open(resaved.save_snap(snapshot), "rb") as ours, open(original, "rb") as theirs:
            assert ours.read() == theirs.read(), name
    assert not [n for n in os.listdir(snap_dir) if n.endswith(".broken")]
