"""The space quota on three members in one event loop: a client writes until the cluster
refuses; the NOSPACE alarm is then raised on every member alike, reads, deletes and
compaction still work, and after compaction and a disarm writes succeed again. Nobody crashes
or changes term because of it."""

import asyncio
import io
import json

from kvserver.cli import build_parser
from kvserver.client import AsyncClient, NoSpaceError
from kvserver.kvpb.alarm import AlarmMember, AlarmRequest, AlarmType
from kvserver.kvpb.kv import RangeRequest
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

QUOTA = 64 * 1024


async def cli(*argv: str) -> tuple[int, str, str]:
    """Run a ``raftkv`` command in a thread (it runs its own event loop) while the members
    keep serving on this one."""
    args = build_parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    status = await asyncio.to_thread(args.func, args, out, err)
    return status, out.getvalue(), err.getvalue()


async def test_nospace_alarm_on_every_member_and_recovery(tmp_path):
    async with running(configs(tmp_path, quota_backend_bytes=QUOTA)) as members:
        leader = await wait_leader(members)
        term = leader.node.term
        urls = [m.cfg.advertise_client_urls[0] for m in members]
        async with AsyncClient(urls, timeout_s=10.0) as client:
            refused = None
            for i in range(1000):  # 64 KiB of ~1.3 KB versions of a few keys: ~50 writes
                try:
                    await client.put(f"k{i % 4}", "x" * 1024)
                except NoSpaceError as err:
                    refused = err
                    break
            assert refused is not None and i > 10
            assert refused.message == "etcdserver: mvcc: database space exceeded"
            assert refused.code == 8 and refused.http_status == 429

            raised = AlarmMember(leader.member_id, AlarmType.NOSPACE)
            for m in members:  # GET is linearizable: the ACTIVATE is applied everywhere
                assert (await m.kv.alarm(AlarmRequest())).alarms == (raised,)
                assert m.kv.status().errors == (f"memberID:{leader.member_id} alarm:NOSPACE ",)
                got = await m.kv.range(RangeRequest(b"k0"))  # reads still work
                assert got.kvs[0].value == b"x" * 1024
            listed = await client.alarm_list()
            assert [(a.member_id, a.alarm) for a in listed.alarms] == [
                (leader.member_id, AlarmType.NOSPACE)
            ]
            status, out, _ = await cli("alarm", "list", "--endpoints", urls[1])
            assert status == 0
            assert [c.strip() for c in out.splitlines()[3].split("|")[1:-1]] == [
                f"{leader.member_id:x}",
                "NOSPACE",
            ]
            status, out, _ = await cli("status", "--endpoints", urls[0])
            head = [c.strip() for c in out.splitlines()[1].split("|")[1:-1]]
            row = [c.strip() for c in out.splitlines()[3].split("|")[1:-1]]
            assert head[head.index("DB SIZE") + 1] == "QUOTA"
            assert row[head.index("QUOTA")] == "65.5 kB"
            assert row[head.index("ERRORS")] == f"memberID:{leader.member_id} alarm:NOSPACE"
            try:  # even a tiny put is refused while the alarm is raised
                await client.put("tiny", "v")
                raise AssertionError("a put was accepted under a NOSPACE alarm")
            except NoSpaceError:
                pass

            deleted = await client.delete("k3")
            assert deleted.deleted == 1
            await client.compact(deleted.header.revision)
            await async_wait_for(  # followers apply the compaction a moment later
                lambda: all(m.kv.store.db_size_bytes < QUOTA // 4 for m in members),
                10.0,
                "the compaction applied on every member",
            )
            status, out, _ = await cli("alarm", "disarm", "--json", "--endpoints", urls[2])
            assert status == 0
            assert json.loads(out)["alarms"] == [
                {
                    "member_id": leader.member_id,
                    "member_id_hex": f"{leader.member_id:x}",
                    "alarm": "NOSPACE",
                }
            ]
            assert await cli("alarm", "list", "--endpoints", urls[0]) == (0, "(no alarms)\n", "")
            assert (await client.alarm_list()).alarms == ()
            await client.put("after", "ok")
            assert (await client.get("after")).value == b"ok"

        for m in members:
            assert m.kv.alarms.get() == ()
            assert m.node.term == term and not m.node.failed.is_set()
        assert (await wait_leader(members)) is leader
