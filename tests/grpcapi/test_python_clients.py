"""etcd's Python gRPC clients, unchanged, against raftkv: the same scenario, the same answers
as a real etcd.

python-etcd3 (``etcd3``), its fork etcd-sdk-python (``pyetcd``) and ``aetcd`` each run one
scenario (put, get, prefix, txn, replace, lease with keys, refresh and revoke, a prefix
watch, a lock, member list, status, delete prefix) in a process of their own
(``python_clients/*_scenario.py``): their generated etcd stubs cannot be loaded beside
raftkv's. What a client saw against a three-member raftkv must equal what it saw against
Debian's etcd 3.4.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.etcd_process import etcd_process
from tests.support import async_procs
from tests.support.grpc_members import target
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

pytestmark = [pytest.mark.slow, pytest.mark.external]

HERE = Path(__file__).parent / "python_clients"
SCENARIOS = {
    "etcd3": [str(HERE / "etcd3_scenario.py"), "etcd3"],
    "etcd-sdk-python": [str(HERE / "etcd3_scenario.py"), "pyetcd"],
    "aetcd": [str(HERE / "aetcd_scenario.py")],
}
# python-etcd3's stubs predate protobuf 4: its C++/upb runtime refuses them.
ENV = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
RUN_TIMEOUT_S = 90.0


async def run_scenario(client: str, host: str, port: int) -> dict:
    code, out, err = await async_procs.run(
        [sys.executable, *SCENARIOS[client], host, str(port)], RUN_TIMEOUT_S, env=ENV
    )
    assert code == 0, f"{client} failed:\n{err[-3000:]}"
    return json.loads(out)


async def answers_of_etcd(tmp_path) -> dict[str, dict]:
    (tmp_path / "etcd").mkdir()
    with etcd_process(str(tmp_path / "etcd")) as etcd:
        host, port = etcd.url.removeprefix("http://").rsplit(":", 1)
        return {client: await run_scenario(client, host, int(port)) for client in SCENARIOS}


@pytest.mark.parametrize("frontends", [0, 1], ids=["on-the-member", "through-frontends"])
async def test_python_clients_see_what_they_see_against_etcd(tmp_path, frontends):
    """With ``frontends``, each member hands its gRPC connections to a front-end process."""
    expected = await answers_of_etcd(tmp_path)
    async with running(configs(tmp_path, grpc_frontends=frontends)) as members:
        await wait_leader(members)
        if frontends:
            await async_wait_for(
                lambda: all(m.grpc.frontends.ready == frontends for m in members),
                30.0,
                "the front ends ready",
            )
        for client in SCENARIOS:
            member = members[len(client) % 3]  # not always the leader
            host, port = target(member).split(":")
            got = await run_scenario(client, host, int(port))
            assert got == expected[client], client
        if frontends:
            assert all(m.grpc.connections_accepted == 0 for m in members)
            assert sum(m.grpc.frontends.calls_served for m in members) >= len(SCENARIOS)
