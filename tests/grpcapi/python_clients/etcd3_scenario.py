"""One scenario through python-etcd3's API, run as ``python etcd3_scenario.py MODULE HOST PORT``.

MODULE is ``etcd3`` (python-etcd3) or ``pyetcd`` (etcd-sdk-python, a fork with the same API).
Prints one JSON object of what the client saw; the test runs it against raftkv and against a
real etcd and compares. Runs in its own process: the client's generated etcd stubs cannot be
loaded beside raftkv's (protobuf refuses two definitions of ``etcdserverpb.*``).
Nothing in the output depends on ids the servers choose (lease and member ids).
"""

import importlib
import json
import sys


def main() -> None:
    mod = importlib.import_module(sys.argv[1])
    c = mod.client(host=sys.argv[2], port=int(sys.argv[3]), timeout=10)
    out: dict = {}
    c.put("/s/a", "1")
    c.put("/s/b", "2")
    value, meta = c.get("/s/a")
    out["get"] = [value.decode(), meta.version, meta.create_revision == meta.mod_revision]
    out["missing"] = c.get("/s/zzz")[0]
    out["prefix"] = sorted((m.key.decode(), v.decode()) for v, m in c.get_prefix("/s/"))
    ok, responses = c.transaction(
        compare=[c.transactions.value("/s/a") == "1", c.transactions.version("/s/b") > 0],
        success=[c.transactions.put("/s/c", "3"), c.transactions.get("/s/b")],
        failure=[c.transactions.put("/s/d", "4")],
    )
    out["txn"] = [ok, [[v.decode() for v, _ in r] for r in responses if isinstance(r, list)]]
    ok, _ = c.transaction(
        compare=[c.transactions.value("/s/a") == "nope"],
        success=[],
        failure=[c.transactions.put("/s/d", "4")],
    )
    out["txn_failed"] = [ok, c.get("/s/d")[0].decode()]
    out["replace"] = [c.replace("/s/a", "1", "1b"), c.replace("/s/a", "1", "1c")]

    lease = c.lease(60)
    c.put("/s/l", "x", lease=lease)
    out["lease"] = [lease.granted_ttl, [k.decode() for k in lease.keys]]
    lease.refresh()
    out["lease_ttl_positive"] = lease.remaining_ttl > 0
    lease.revoke()
    out["after_revoke"] = c.get("/s/l")[0]

    events, cancel = c.watch_prefix("/s/w/")
    c.put("/s/w/1", "a")
    c.delete("/s/w/1")
    seen = []
    for event in events:
        seen.append([type(event).__name__, event.key.decode(), event.value.decode()])
        if len(seen) == 2:
            break
    cancel()
    out["watch"] = seen

    with c.lock("job", ttl=10) as lock:
        out["locked"] = lock.is_acquired()
    out["members"] = len(list(c.members)) > 0
    out["status_has_leader"] = c.status().leader is not None
    out["delete_prefix"] = c.delete_prefix("/s/").deleted
    out["after_delete"] = list(c.get_prefix("/s/"))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
