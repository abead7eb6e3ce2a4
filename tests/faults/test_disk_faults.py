"""Disk faults under real member processes, one member at a time, follower or leader:
a full disk (a size-limited tmpfs the test mounts), and EIO/ENOSPC from the WAL's pwrite,
from fdatasync and from rename (libfiu's failpoints, switched on from outside with
fiu-ctrl while the cluster takes writes).

Each test checks what docs/reliability.md promises for the fault:
- no acknowledged write is lost (all read back after the member is back);
- no WAL or snapshot file is left that fails to open (``check_files_open``; and the member
  starts again from them);
- the member stops (a failed fdatasync is never retried and never acknowledged: the WAL
  refuses every later write and the member exits; a full disk likewise) or keeps going;
- the others keep serving meanwhile (acknowledged writes keep coming through them).

Snapshots are taken often (``--snapshot-count``) so that snapshot writes and the WAL's
segment cuts (preallocation, rename) are among the paths the faults hit.
"""

import errno
import os
import signal
import subprocess
import time

import pytest

from tests.cluster.harness import wait_healthy
from tests.faults import shims
from tests.faults.support import (
    FAST_TIMING,
    FaultCluster,
    Load,
    can_mount,
    check_acked,
    check_files_open,
    metric,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

SNAPSHOT_OFTEN = ["--snapshot-count", "300", "--snapshot-catchup-entries", "100"]


def _victim(cluster: FaultCluster, role: str):
    leader = cluster.leader()
    if role == "leader":
        return leader
    return next(n for n in cluster.nodes if n is not leader)


def _start_under_load(cluster: FaultCluster, role: str):
    """Start the cluster, put it under a write load; (the load, the member in ``role``)."""
    cluster.start()
    wait_healthy(cluster)
    load = Load(cluster.endpoints, threads=4).start()
    wait_for(lambda: load.acked_count() > 300, 60, "writes before the fault")
    return load, _victim(cluster, role)


def _others_keep_serving(load: Load, count: int = 100, timeout_s: float = 60) -> None:
    before = load.acked_count()
    wait_for(lambda: load.acked_count() >= before + count, timeout_s, "writes via the others")


def _wait_exit(cluster: FaultCluster, node, timeout_s: float = 60) -> int:
    wait_for(lambda: not node.alive(), timeout_s, f"{node.name} to stop")
    assert node.proc is not None
    return node.proc.returncode


def _restart_and_check(cluster: FaultCluster, load: Load, victim) -> None:
    load.stop()
    check_files_open(victim)
    cluster.start_node(victim)
    wait_healthy(cluster, timeout_s=120)
    check_acked(cluster, load.acked)


def _fill(path: str) -> str:
    """Fill the file system of ``path`` to the last byte; the filler file's name."""
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


@pytest.mark.parametrize(
    "role,size",
    [("follower", "160m"), ("leader", "160m"), ("leader", "24m")],
    ids=["follower", "leader", "leader-disk-smaller-than-a-wal-segment"],
)
def test_full_disk(tmp_path, role, size):
    """A member's disk fills up under load: it stops, saying the disk is full (the first
    write that needed space: a snapshot file, with snapshots this frequent); the others
    go on; with space freed it starts again and catches up. On a 24 MiB disk the 64 MiB WAL
    segments cannot be preallocated whole: the member starts with what fits and the same
    holds."""
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root")
    cluster = FaultCluster(str(tmp_path / "c"), size=3, extra_args=[*FAST_TIMING, *SNAPSHOT_OFTEN])
    for n in cluster.nodes:
        cluster.mount_tmpfs(n, size)
    load = None
    try:
        load, victim = _start_under_load(cluster, role)
        filler = _fill(victim.data_dir)
        code = _wait_exit(cluster, victim, timeout_s=120)
        assert code != 0
        tail = cluster.log_tail(victim, 60)
        assert "the disk is full" in tail, tail
        print("\n".join(line for line in tail.splitlines() if "Error" in line or "File" in line))
        _others_keep_serving(load)
        os.remove(filler)
        _restart_and_check(cluster, load, victim)
    finally:
        if load is not None:
            load.stop()
        cluster.stop()


FIU_CASES = [
    # (failpoint, errno, role, the member must stop)
    ("posix/io/sync/fdatasync", errno.EIO, "follower", True),
    ("posix/io/sync/fdatasync", errno.EIO, "leader", True),
    ("posix/io/sync/fdatasync", errno.ENOSPC, "leader", True),
    ("posix/io/rw/pwrite", errno.EIO, "follower", True),
    ("posix/io/rw/pwrite", errno.ENOSPC, "leader", True),
    ("posix/io/dir/rename", errno.EIO, "follower", True),
    ("posix/io/dir/rename", errno.ENOSPC, "leader", True),
]


@pytest.mark.parametrize(
    "failpoint,err,role,stops",
    FIU_CASES,
    ids=[f"{fp.rsplit('/', 1)[1]}-{errno.errorcode[e]}-{r}" for fp, e, r, _ in FIU_CASES],
)
def test_io_errors(tmp_path, failpoint, err, role, stops):
    wrapper = shims.fiu_wrapper()
    cluster = FaultCluster(
        str(tmp_path / "c"),
        size=3,
        # Whole snapshots (a forked child inherits the enabled failpoints): a continued
        # snapshot is written by a process started anew, out of the failpoint's reach.
        extra_args=[*FAST_TIMING, *SNAPSHOT_OFTEN, "--snapshot-incremental", "false"],
        node_wrapper={f"node{i}": wrapper for i in (1, 2, 3)},
    )
    load = None
    try:
        load, victim = _start_under_load(cluster, role)
        assert victim.proc is not None
        shims.fiu_enable(victim.proc.pid, failpoint, err)
        enabled_at = time.monotonic()
        if stops:
            # A rename happens at a segment cut or a snapshot: within a few hundred writes.
            code = _wait_exit(cluster, victim, timeout_s=120)
            assert code != 0
            print(f"{victim.name} stopped {time.monotonic() - enabled_at:.1f} s after the fault")
            print(cluster.log_tail(victim, 15))
        _others_keep_serving(load)
        if victim.alive():
            shims.fiu_disable(victim.proc.pid, failpoint)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(30)
        _restart_and_check(cluster, load, victim)
    finally:
        if load is not None:
            load.stop()
        cluster.stop()


def test_archive_staging_on_a_full_disk_does_not_stop_the_member(tmp_path):
    """The continuous archive's target fills up: each pass fails (objects are staged under
    a temporary name first), the member keeps serving and says so in its metrics; with
    room again the archive catches up and no staged object is left behind."""
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root")
    target = tmp_path / "archive"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
    cluster = FaultCluster(
        str(tmp_path / "c"),
        size=3,
        extra_args=[*FAST_TIMING, *SNAPSHOT_OFTEN, "--archive-interval", "200"],
    )
    cluster.nodes[0].args += ["--archive-url", f"file://{target}"]
    archiving = cluster.nodes[0]
    cluster.start()
    load = None
    try:
        wait_healthy(cluster)
        load = Load(cluster.endpoints, threads=4).start()
        wait_for(
            lambda: (metric(archiving, "raftkv_archive_errors_total") or 0) > 0,
            120,
            "archive passes failing on the full target",
        )
        assert archiving.alive()
        _others_keep_serving(load)
        subprocess.run(["mount", "-o", "remount,size=512m", str(target)], check=True)
        load.stop()
        wait_for(
            lambda: metric(archiving, "raftkv_archive_lag_entries") == 0,
            120,
            "the archive to catch up",
        )
        leftovers = [p for p in target.rglob("*") if ".tmp-" in p.name]
        assert not leftovers, leftovers
        check_acked(cluster, load.acked)
    finally:
        if load is not None:
            load.stop()
        cluster.stop()
        subprocess.run(["umount", "-l", str(target)], check=False)
