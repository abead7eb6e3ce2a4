"""Small and full disks.

A member must start on a 20 MB file system (a 64 MB preallocated segment plus a 64 MB spare
would not fit), and a full disk must say more than "[Errno 28] No space left on device"
without a path. So: preallocation takes at most a quarter of the free space and a full disk only drops it
(``wal.segment.preallocation_bytes``/``preallocate``); every disk error of the WAL names its
file, and for a full disk the free space of that file system; ``repair`` on a disk without
room for a whole ``.broken`` copy keeps the torn bytes only.

The fast tests fake the free space and ENOSPC; the slow one mounts a real 20 MB ext4 image
(root only) and runs a member on it until the disk fills.
"""

import errno
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

import wal
import wal.segment
from tests.support.procs import stop_process
from tests.wal.helpers import entries
from wal.segment import PREALLOCATE_FREE_SHARE, preallocate, preallocation_bytes

repair_module = importlib.import_module("wal.repair")  # `wal.repair` is also the function

MB = 1 << 20


def _statvfs_with_free(free_bytes: int):
    def fake(path):
        return SimpleNamespace(f_bavail=free_bytes // 4096, f_frsize=4096)

    return fake


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_preallocation_is_the_segment_size_on_a_roomy_disk(monkeypatch, tmp_path):
    monkeypatch.setattr(wal.segment.os, "statvfs", _statvfs_with_free(100 << 30))
    assert preallocation_bytes(str(tmp_path), 64 * MB) == 64 * MB


def test_preallocation_is_a_share_of_the_free_space_on_a_small_disk(monkeypatch, tmp_path):
    monkeypatch.setattr(wal.segment.os, "statvfs", _statvfs_with_free(18 * MB))
    got = preallocation_bytes(str(tmp_path), 64 * MB)
    assert got == int(18 * MB * PREALLOCATE_FREE_SHARE) // 4096 * 4096
    monkeypatch.setattr(wal.segment.os, "statvfs", _statvfs_with_free(0))
    assert preallocation_bytes(str(tmp_path), 64 * MB) == 0


def test_preallocate_on_a_full_disk_keeps_the_file_and_says_so(monkeypatch, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDWR)
    try:
        monkeypatch.setattr(wal.segment.os, "posix_fallocate", _enospc)
        assert preallocate(fd, 64 * MB) is False
        assert os.fstat(fd).st_size == 100
    finally:
        os.close(fd)


def test_a_wal_is_created_on_a_small_disk_with_small_preallocations(monkeypatch, tmp_path):
    monkeypatch.setattr(wal.segment.os, "statvfs", _statvfs_with_free(16 * MB))
    w = wal.create(str(tmp_path / "w"), b"meta", segment_size_bytes=64 * MB)
    try:
        w.save(None, entries(1, 5))
        for path in os.listdir(tmp_path / "w"):
            assert os.path.getsize(tmp_path / "w" / path) <= 4 * MB, path
    finally:
        w.close()


def test_a_full_disk_on_write_names_the_segment_and_the_free_space(monkeypatch, tmp_path):
    w = wal.create(str(tmp_path / "w"), b"meta")
    try:
        tail = w.segment_paths()[-1]
        monkeypatch.setattr(wal.wal, "pwrite_all", _enospc)
        with pytest.raises(wal.WalFailedError) as info:
            w.save(None, entries(1, 1))
        message = str(info.value)
        assert message.startswith(f"writing {tail}: No space left on device")
        assert f"free space on the file system holding {tmp_path / 'w'}:" in message
        assert wal.errors.is_disk_full(info.value)
    finally:
        monkeypatch.undo()
        w.close()


def test_a_full_disk_on_fsync_names_the_segment(tmp_path):
    def sync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    w = wal.create(str(tmp_path / "w"), b"meta", sync_fn=sync)
    try:
        with pytest.raises(wal.WalFailedError, match=f"syncing {w.segment_paths()[-1]}: No"):
            w.save(None, entries(1, 1))
    finally:
        w.close()


def test_a_full_disk_while_preparing_the_next_segment_names_the_tmp_file(monkeypatch, tmp_path):
    real_open = wal.segment.open_locked

    def open_locked(path, *, create=False):
        if path.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, create=create)

    monkeypatch.setattr(wal.segment, "open_locked", open_locked)
    w = wal.create(str(tmp_path / "w"), b"meta", segment_size_bytes=4096, prepare_ahead=False)
    try:
        with pytest.raises(wal.WalFailedError) as info:
            w.save(None, entries(1, 64, size=128))  # crosses 4096 bytes: a cut
        assert f"{tmp_path / 'w'}{os.sep}0.tmp: No space left on device" in str(info.value)
        assert wal.errors.is_disk_full(info.value)
    finally:
        w.close()


def test_repair_without_room_for_a_whole_copy_keeps_the_torn_bytes(monkeypatch, tmp_path):
    d = str(tmp_path / "w")
    w = wal.create(d, b"meta")
    w.save(None, entries(1, 3))
    seg = w.segment_paths()[-1]
    w.close()
    good = os.path.getsize(seg)
    with open(seg, "r+b") as f:  # a 4 KiB record of which only the head reached the disk
        end = _end_of_data(d)
        f.seek(end)
        f.write((4096).to_bytes(8, "little") + b"\x08\x02\x10" + b"\x7f" * 597)
    real = repair_module.pwrite_all

    def pwrite_all(fd, data, offset):  # room for a few KiB, not for the whole segment
        if len(data) > 64 * 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(repair_module, "pwrite_all", pwrite_all)
    assert wal.repair(d) is True
    assert not os.path.exists(seg + ".broken")
    kept = f"{seg}.broken-from-{end}"
    assert open(kept, "rb").read() == (4096).to_bytes(8, "little") + b"\x08\x02\x10" + b"\x7f" * 597
    assert os.path.getsize(seg) == end <= good
    r = wal.open(d)
    try:
        assert [e.index for e in r.read_all()[2]] == [1, 2, 3]
    finally:
        r.close()


def _end_of_data(d: str) -> int:
    from wal.dump import DumpRecord, dump

    last = [r for r in dump(d) if isinstance(r, DumpRecord)][-1]
    return last.offset + last.frame_bytes


# --- a real 20 MB file system --------------------------------------------------------------


@pytest.fixture
def tiny_fs():
    """A mounted 20 MB ext4 image (root only); unmounted and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 20 MB ext4 image needs root")
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed (e2fsprogs)")
    top = tempfile.mkdtemp(prefix="raftkv-tinyfs-")
    img, mnt = os.path.join(top, "img"), os.path.join(top, "mnt")
    os.mkdir(mnt)
    mounted = False
    try:
        with open(img, "wb") as f:
            f.truncate(20 * MB)
        for cmd in (["mkfs.ext4", "-q", img], ["mount", "-o", "loop", img, mnt]):
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                pytest.skip(f"{' '.join(cmd[:2])} failed: {res.stderr.strip()}")
        mounted = True
        yield mnt
    finally:
        if mounted:
            subprocess.run(["umount", mnt], capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)


def _http(method: str, url: str, data: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _serve(data_dir: str, log_path: str) -> tuple[subprocess.Popen, str]:
    from kvserver.localcluster.launcher import free_ports

    client, peer = free_ports(2)
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvserver.cli",
            "serve",
            "--data-dir",
            data_dir,
            "--listen-client-urls",
            c,
            "--advertise-client-urls",
            c,
            "--listen-peer-urls",
            p,
            "--initial-advertise-peer-urls",
            p,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 60
    while _http("GET", c + "/health") != 200:
        assert proc.poll() is None, open(log_path).read()[-3000:]
        assert time.monotonic() < deadline, "member not healthy in 60 s"
        time.sleep(0.1)
    return proc, c


@pytest.mark.slow
def test_member_runs_on_a_20mb_disk_stops_cleanly_when_full_and_restarts(tiny_fs, tmp_path):
    data_dir = os.path.join(tiny_fs, "member1")
    log_path = str(tmp_path / "member.log")
    proc, url = _serve(data_dir, log_path)
    acked = []
    value = os.urandom(750_000)
    try:
        for i in range(60):  # 45 MB of values cannot fit on 20 MB
            if _http("PUT", f"{url}/v1/kv/k{i}", value) != 200:
                break
            acked.append(i)
        proc.wait(timeout=60)
    finally:
        stop_process(proc, 20)
    log = open(log_path).read()
    assert proc.returncode not in (0, None), log[-3000:]
    assert 3 <= len(acked) < 60
    assert "stopped: the disk is full" in log
    wal_dir = os.path.join(data_dir, "member", "wal")
    assert f"{wal_dir}{os.sep}" in log and "No space left on device" in log
    assert f"Free space on the file system holding {data_dir}" in log

    # Restarted on the same full disk, it repairs its torn tail and serves what was acked.
    proc, url = _serve(data_dir, log_path)
    try:
        for i in acked:
            with urllib.request.urlopen(f"{url}/v1/kv/k{i}", timeout=10) as resp:
                assert resp.read() == value, f"k{i}"
    finally:
        stop_process(proc, 20)
