"""Fault shims for real member processes: built or located by the test, never committed.

- ``build_slowsync(dir)``: an ``LD_PRELOAD`` library, compiled with gcc from the few lines of
  C below, whose ``fdatasync`` first sleeps for the number of milliseconds written in the
  file named by ``$SLOWSYNC_FILE`` (read on every call; no file or 0: no delay). A test
  makes a member's disk slow, stalled or healthy again by writing that file.
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
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long delay_ms(void) {
    const char *path = getenv("SLOWSYNC_FILE");
    char buf[32] = {0};
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n > 0 ? atol(buf) : 0;
}

int fdatasync(int fd) {
    static int (*real)(int);
    long ms = delay_ms();
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
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
