"""A three-member raftkv cluster in one background event loop (no subprocesses), for the
end-to-end bench tests: real storage, transport and HTTP, started and stopped per test."""

import asyncio
import concurrent.futures
import io
import threading

import pytest

from kvserver.assembly.member import Member
from tests.support.inprocess import configs, stop_all, wait_leader


class InProcessCluster:
    def __init__(self, tmp_path):
        self.cfgs = configs(tmp_path, prefix="b", token="bench")
        self.endpoints = [c.listen_client_urls[0] for c in self.cfgs]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.members: list[Member] = []

    def call(self, coro, timeout_s=30.0):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise AssertionError(
                f"the in-process cluster did not finish within {timeout_s} s; "
                f"its tasks:\n{self._task_stacks()}"
            ) from None

    def _task_stacks(self) -> str:
        """Where every task of the cluster's loop waits (a diagnosis of a hang)."""
        out = io.StringIO()
        for task in list(asyncio.all_tasks(self.loop)):
            out.write(f"- {task.get_name()}: {task.get_coro()!r}\n")
            task.print_stack(limit=6, file=out)
        return out.getvalue()

    def start(self):
        self.thread.start()

        async def start():
            self.members = [Member(c) for c in self.cfgs]
            for m in self.members:
                await m.start()
            await wait_leader(self.members)

        self.call(start())

    def stop(self):
        try:
            self.call(stop_all(self.members))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def revision(self) -> int:
        return max(m.node.sm.store.revision for m in self.members)


@pytest.fixture
def inproc_cluster(tmp_path):
    c = InProcessCluster(tmp_path)
    c.start()
    try:
        yield c
    finally:
        c.stop()
