"""One scenario through aetcd's asyncio API, run as ``python aetcd_scenario.py HOST PORT``.

Prints one JSON object of what the client saw; the test runs it against raftkv and against a
real etcd and compares. Runs in its own process (its etcd stubs cannot be loaded beside
raftkv's). Nothing in the output depends on ids the servers choose.
"""

import asyncio
import json
import sys

import aetcd


async def scenario(c: aetcd.Client) -> dict:
    out: dict = {}
    await c.put(b"/s/a", b"1")
    await c.put(b"/s/b", b"2")
    got = await c.get(b"/s/a")
    out["get"] = [got.value.decode(), got.version, got.create_revision == got.mod_revision]
    out["missing"] = await c.get(b"/s/zzz")
    out["prefix"] = sorted(
        [kv.key.decode(), kv.value.decode()] for kv in await c.get_prefix(b"/s/")
    )
    ok, _ = await c.transaction(
        compare=[c.transactions.value(b"/s/a") == b"1"],
        success=[c.transactions.put(b"/s/c", b"3")],
        failure=[c.transactions.put(b"/s/d", b"4")],
    )
    out["txn"] = ok
    lease = await c.lease(60)
    await c.put(b"/s/l", b"x", lease=lease)
    out["lease"] = [await lease.granted_ttl(), [k.decode() for k in await lease.keys()]]
    await lease.refresh()
    await lease.revoke()
    out["after_revoke"] = await c.get(b"/s/l")

    watch = await c.watch_prefix(b"/s/w/")
    await c.put(b"/s/w/1", b"a")
    await c.delete(b"/s/w/1")
    seen = []
    async for event in watch:
        seen.append([str(event.kind), event.kv.key.decode(), event.kv.value.decode()])
        if len(seen) == 2:
            break
    await watch.cancel()
    out["watch"] = seen

    async with c.lock(b"job", ttl=10) as lock:
        out["locked"] = await lock.is_acquired()
    out["members"] = len([m async for m in c.members()]) > 0
    out["status_has_leader"] = (await c.status()).leader is not None
    out["delete_prefix"] = (await c.delete_prefix(b"/s/")).deleted
    return out


async def main() -> None:
    async with aetcd.Client(host=sys.argv[1], port=int(sys.argv[2]), timeout=10) as c:
        out = await asyncio.wait_for(scenario(c), 60)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    asyncio.run(main())
