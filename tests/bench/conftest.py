"""A three-member raftkv cluster in one background event loop (no subprocesses), for the
end-to-end bench tests: real storage, transport and HTTP, started and stopped per test."""

import asyncio
import threading

import pytest

from kvserver.cluster import free_ports
from kvserver.config import ServerConfig
from kvserver.membership import parse_initial_cluster
from kvserver.server import Member


def _configs(tmp_path) -> list[ServerConfig]:
    ports = free_ports(6)
    initial = ",".join(f"b{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(3))
    members = tuple(parse_initial_cluster(initial, "bench"))
    out = []
    for i in range(3):
        client = (f"http://127.0.0.1:{ports[2 * i]}",)
        peer = (f"http://127.0.0.1:{ports[2 * i + 1]}",)
        out.append(ServerConfig(
            name=f"b{i}", data_dir=str(tmp_path / f"b{i}"), listen_client_urls=client,
            advertise_client_urls=client, listen_peer_urls=peer,
            initial_advertise_peer_urls=peer, initial_cluster=initial,
            initial_cluster_token="bench", heartbeat_interval_ms=20, election_timeout_ms=200,
            members=members))
    return out


class InProcessCluster:
    def __init__(self, tmp_path):
        self.cfgs = _configs(tmp_path)
        self.endpoints = [c.listen_client_urls[0] for c in self.cfgs]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.members: list[Member] = []

    def call(self, coro, timeout_s=30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self):
        self.thread.start()

        async def start_all():
            self.members = [Member(c) for c in self.cfgs]
            for m in self.members:
                await m.start()
            deadline = self.loop.time() + 15
            while self.loop.time() < deadline:
                leaders = [m for m in self.members if m.node.is_leader]
                if len(leaders) == 1 and all(m.node.leader == leaders[0].member_id
                                             for m in self.members):
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("no agreed leader")

        self.call(start_all())

    def stop(self):
        async def stop_all():
            for m in self.members:
                await m.stop()

        try:
            self.call(stop_all())
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
