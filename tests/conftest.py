"""Shared pytest helpers.

External programs (etcd, Java, Docker): a test that needs one calls
``require_program("etcd")``. On a developer machine without it the test is skipped with a
clear reason; when ``RAFTKV_REQUIRE_EXTERNAL=1`` (set by .ci/run, which installs them) a
missing program is a failure, so CI never silently skips. Tests that need one are marked
``external``; when etcd is missing (and not required), the run says at its start how many of
the selected tests will skip for it and how to install it.

A test may be an ``async def``: it runs in a fresh event loop of its own (``asyncio.run``,
so the loop policy in force, uvloop's included, makes the loop), with its fixtures as
arguments. The loop is closed, and every task it left is cancelled, before the next test.
"""

import asyncio
import inspect
import os
import shutil

import pytest
from hypothesis import settings


def external_required() -> bool:
    return os.environ.get("RAFTKV_REQUIRE_EXTERNAL", "") not in ("", "0")


ETCD_INSTALL = "apt-get install etcd-server etcd-client"


# Hypothesis's per-example deadline (200 ms by default) fails a test for the machine's speed,
# not the code's: CI shares two cores with everything else. A property's examples are still
# bounded by the suite's per-test timeout.
settings.register_profile("raftkv", deadline=None)
settings.load_profile("raftkv")


def require_program(name: str, hint: str = "") -> str:
    """Return the path of ``name`` on PATH, or skip (locally) / fail (in CI) without it."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed{': ' + hint if hint else ''}"
    if external_required():
        pytest.fail(f"{reason} (RAFTKV_REQUIRE_EXTERNAL=1: .ci/run should have installed it)")
    pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run an ``async def`` test to completion in a new event loop.

    The loop runs in the calling (main) thread, so pytest-timeout's signal method
    interrupts it like any other test, and the tasks it prints at the timeout are this
    loop's."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


# Suites that need minutes, a JVM or root (Spark, chaos, Docker) run in the slow phase of
# `make test`: marking one of them is enough, the slow mark follows.
_ALWAYS_SLOW = ("spark", "chaos", "docker")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in _ALWAYS_SLOW) and not item.get_closest_marker(
            "slow"
        ):
            item.add_marker(pytest.mark.slow)


# ---------------------------------------------------------------------------------------------
# A hang fails fast, with the stacks of every thread and every asyncio task
#
# pyproject.toml gives each test pytest-timeout's 120 s with the "signal" method: at the
# timeout the test fails with its own traceback and the stacks of the other threads, and the
# run goes on with the next test. Added here:
# - slow-marked tests (slow/spark/chaos/docker) without a timeout mark of their own get
#   SLOW_TIMEOUT_S, unless --timeout or PYTEST_TIMEOUT chose one for the whole run;
# - at the timeout, every task of every running asyncio loop is printed with its await chain
#   (which coroutine awaits which, down to the future it waits for): a thread's stack shows
#   only "the loop is in select()";
# - a backstop: pytest-timeout stops timing a test once it failed, so a teardown that hangs
#   after a failure (a fixture whose close() never returns) would hang the run for ever. If a
#   test's whole run (setup, call, teardown) passes its timeout + BACKSTOP_S, every asyncio
#   task and every thread is dumped to stderr and the process exits 1.

SLOW_TIMEOUT_S = 300
BACKSTOP_S = 60


def _needs_etcd(item) -> bool:
    """Marked external, and not for Docker, Java or the chaos suites: etcd is what it needs."""
    return item.get_closest_marker("external") is not None and not any(
        item.get_closest_marker(m) for m in ("docker", "spark", "chaos")
    )


def _say_etcd_is_missing(session) -> None:
    if external_required() or shutil.which("etcd"):
        return
    count = sum(1 for item in session.items if _needs_etcd(item))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if count and reporter is not None:
        reporter.write_line(
            f"etcd is not installed: {count} selected test(s) that run against a real etcd "
            f"will be skipped. Install it with: {ETCD_INSTALL}",
            yellow=True,
            bold=True,
        )


def pytest_collection_finish(session):
    _say_etcd_is_missing(session)
    config = session.config
    if not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    for item in session.items:
        slow = any(item.get_closest_marker(m) for m in ("slow", *_ALWAYS_SLOW))
        if slow and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


def _coroutine_frames(coro):
    """The frames of ``coro`` and of what it awaits, outermost first, and the first awaited
    object that is not a coroutine (a future; None when the chain ends in a coroutine)."""
    frames = []
    while coro is not None and len(frames) < 100:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is None:
            return frames, None if not frames else coro
        frames.append(frame)
        awaited = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
        if awaited is None or not any(
            hasattr(awaited, a) for a in ("cr_frame", "gi_frame", "ag_frame")
        ):
            return frames, awaited
        coro = awaited
    return frames, None


def format_asyncio_tasks() -> str:
    """Every pending task of every running event loop (all threads), with its await chain."""
    import asyncio
    import gc
    import linecache
    import threading

    out = []
    threads = {t.ident: t.name for t in threading.enumerate()}
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
    for loop in loops:
        if loop.is_closed() or not loop.is_running():
            continue
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        except RuntimeError:
            continue
        ident = getattr(loop, "_thread_id", None)  # the thread running it (CPython's loops)
        out.append(
            f"--- event loop in thread {threads.get(ident, '?')} ({ident}): "
            f"{len(tasks)} pending task(s)\n"
        )
        for task in tasks:
            out.append(f"Task {task.get_name()!r}:\n")
            frames, _ = _coroutine_frames(task.get_coro())
            for frame in frames:
                code = frame.f_code
                out.append(
                    f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n'
                )
                line = linecache.getline(code.co_filename, frame.f_lineno).strip()
                if line:
                    out.append(f"    {line}\n")
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is not None:
                out.append(f"  waiting for {waiter!r:.300}\n")
    return "".join(out) or "(no running asyncio event loop)\n"


def _print_asyncio_tasks(item) -> None:
    try:
        text = format_asyncio_tasks()
    except Exception as exc:  # never let the dump hide the timeout itself
        text = f"(could not list asyncio tasks: {exc!r})\n"
    terminal = item.config.get_terminal_writer()
    terminal.sep("~", title="asyncio tasks")
    terminal.write(text)


class _Backstop:
    """Ends the process (exit 1) with every task's and thread's stack on stderr if one test's
    run is not over after ``after_s``."""

    def __init__(self, item, after_s: float, stderr_fd: int) -> None:
        import threading

        self.item = item
        self.stderr_fd = stderr_fd
        self.timer = threading.Timer(after_s, self._fire)
        self.timer.name = f"hang-backstop {item.nodeid}"
        self.timer.daemon = True

    def _fire(self) -> None:
        import faulthandler

        try:
            with os.fdopen(os.dup(self.stderr_fd), "w") as err:
                err.write(
                    f"\n+++ {self.item.nodeid}: still running {BACKSTOP_S} s after its "
                    f"timeout (a hang in teardown?): exiting +++\n"
                )
                try:
                    err.write(format_asyncio_tasks())
                except Exception as exc:
                    err.write(f"(could not list asyncio tasks: {exc!r})\n")
                err.flush()
                faulthandler.dump_traceback(file=err, all_threads=True)
                err.flush()
        finally:
            os._exit(1)


_BACKSTOP_FD = None
_BACKSTOPS = {}


def pytest_configure(config):
    global _BACKSTOP_FD
    # Capture is suspended while plugins are configured: fd 2 is the real stderr here.
    _BACKSTOP_FD = os.dup(2)


def pytest_unconfigure(config):
    global _BACKSTOP_FD
    if _BACKSTOP_FD is not None:
        os.close(_BACKSTOP_FD)
        _BACKSTOP_FD = None


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: also runs with -p no:timeout
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's own timer, plus the asyncio tasks at the timeout and the backstop."""
    import signal
    import threading

    try:
        import pytest_timeout
    except ImportError:
        return None
    if _BACKSTOP_FD is not None and item.nodeid not in _BACKSTOPS:
        backstop = _Backstop(item, settings.timeout + BACKSTOP_S, _BACKSTOP_FD)
        _BACKSTOPS[item.nodeid] = backstop
        backstop.timer.start()
    method = settings.method
    if method == "signal" and threading.current_thread() is not threading.main_thread():
        method = "thread"

    def debugging() -> bool:
        return not settings.disable_debugger_detection and pytest_timeout.is_debugging()

    if method == "signal":

        def on_alarm(signum, frame):
            __tracebackhide__ = True
            if not debugging():
                _print_asyncio_tasks(item)
            pytest_timeout.timeout_sigalrm(item, settings)

        def cancel():
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    else:

        def on_timer():
            if not debugging():
                _print_asyncio_tasks(item)
            pytest_timeout.timeout_timer(item, settings)

        timer = threading.Timer(settings.timeout, on_timer)
        timer.name = f"pytest_timeout {item.nodeid}"
        timer.daemon = True

        def cancel():
            timer.cancel()
            timer.join()

        timer.start()
    item.cancel_timeout = cancel
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    backstop = _BACKSTOPS.pop(item.nodeid, None)
    if backstop is not None:
        backstop.timer.cancel()


def pytest_enter_pdb(config, pdb):
    for backstop in _BACKSTOPS.values():  # someone is debugging: no deadline
        backstop.timer.cancel()
