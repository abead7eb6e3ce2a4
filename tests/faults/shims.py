"""Fault shims for real member processes: built or located by the test, never committed.

- ``build_slowsync(dir)``: an ``LD_PRELOAD`` library, compiled with gcc from the few lines of
  C below, whose ``fdatasync`` first sleeps for the number of milliseconds written in the
  file named by ``$SLOWSYNC_FILE`` (read on every call; no file or 0: no delay), and which
  can also fail ``fdatasync`` or ``pwrite`` (the WAL's writes) with a given errno. A test
  makes a member's disk slow, stalled, failing or healthy again by writing that file
  (``set_delay``, ``set_failure``). The chaos soak uses it rather than libfiu: libfiu's
  preload and libfaketime's crash together in one process.
- ``fiu_wrapper()`` / ``fiu_enable(pid, name, errno)``: libfiu's failpoints (Debian's
  ``fiu-utils``): the member runs under ``fiu-run -x`` and a failpoint such as
  ``posix/io/sync/fdatasync`` is switched on from outside with ``fiu-ctrl``; ``failinfo`` is
  the errno the call then fails with.
- ``faketime_env(file)``: libfaketime (Debian's ``faketime``) preloaded with the wall clock
  offset read from ``file`` (``+3600``, ``-3600``, ``+0 x2`` for a clock running twice as
  fast); the monotonic clock is left alone, as raftkv's timers and leases use it.
"""

import os
import subprocess

from tests.conftest import require_program

SLOWSYNC_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* $SLOWSYNC_FILE holds "<fdatasync delay ms> [<fdatasync errno> [<pwrite errno>]]" */
static void control(long v[3]) {
    const char *path = getenv("SLOWSYNC_FILE");
    char buf[64] = {0};
    v[0] = v[1] = v[2] = 0;
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) sscanf(buf, "%ld %ld %ld", &v[0], &v[1], &v[2]);
}

int fdatasync(int fd) {
    static int (*real)(int);
    long v[3];
    control(v);
    if (v[0] > 0) {
        struct timespec ts = {v[0] / 1000, (v[0] % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
    if (v[1] > 0) { errno = (int)v[1]; return -1; }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

static ssize_t failing_pwrite(const char *name, int fd, const void *buf, size_t n, off_t off) {
    long v[3];
    control(v);
    if (v[2] > 0) { errno = (int)v[2]; return -1; }
    ssize_t (*real)(int, const void *, size_t, off_t) =
        (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, name);
    return real(fd, buf, n, off);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    return failing_pwrite("pwrite", fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    return failing_pwrite("pwrite64", fd, buf, n, off);
}
"""

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def build_slowsync(directory: str) -> str:
    """Compile the slow-fdatasync shim into ``directory``; its path."""
    gcc = require_program("gcc", "Debian's gcc builds the slow-fsync shim")
    src = os.path.join(directory, "slowsync.c")
    lib = os.path.join(directory, "slowsync.so")
    with open(src, "w") as f:
        f.write(SLOWSYNC_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-ldl"], check=True)
    return lib


def slowsync_env(lib: str, control_file: str) -> dict[str, str]:
    with open(control_file, "w") as f:
        f.write("0")
    return {"LD_PRELOAD": lib, "SLOWSYNC_FILE": control_file}


def set_delay(control_file: str, ms: int) -> None:
    tmp = control_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(ms))
    os.replace(tmp, control_file)


def set_failure(control_file: str, fdatasync_errno: int = 0, pwrite_errno: int = 0) -> None:
    tmp = control_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"0 {fdatasync_errno} {pwrite_errno}")
    os.replace(tmp, control_file)


def fiu_wrapper() -> list[str]:
    return [require_program("fiu-run", "Debian's fiu-utils"), "-x"]


def fiu_ctrl(pid: int, command: str) -> None:
    subprocess.run(
        [require_program("fiu-ctrl", "Debian's fiu-utils"), "-c", command, str(pid)],
        check=True,
        timeout=10,
    )


def fiu_enable(pid: int, name: str, errno: int) -> None:
    fiu_ctrl(pid, f"enable name={name},failinfo={errno}")


def fiu_disable(pid: int, name: str) -> None:
    fiu_ctrl(pid, f"disable name={name}")


def faketime_env(offset_file: str, offset: str = "+0") -> dict[str, str]:
    """Environment preloading libfaketime with its wall-clock offset read from
    ``offset_file`` (re-read at most once a second)."""
    require_program("faketime", "Debian's faketime (libfaketime)")
    if not os.path.exists(FAKETIME_LIB):
        import pytest

        pytest.fail(f"{FAKETIME_LIB} is missing though faketime is installed")
    set_offset(offset_file, offset)
    return {
        "LD_PRELOAD": FAKETIME_LIB,
        "FAKETIME_TIMESTAMP_FILE": offset_file,
        "FAKETIME_CACHE_DURATION": "1",
        "DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def set_offset(offset_file: str, offset: str) -> None:
    tmp = offset_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(offset + "\n")
    os.replace(tmp, offset_file)
