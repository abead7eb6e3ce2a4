"""A driver process for the multi-process lock tests: takes a lock, commits, obeys stdin.

``python -m tests.spark_coord.driver ENDPOINTS LOCK TABLE TTL``. It acquires ``FencedLock(LOCK,
TTL)``, commits the next version of ``TABLE`` with its fence, prints ``{"ready": ...}`` and
waits for a line on stdin (the test pauses it meanwhile). On ``commit`` it tries two commits of
the next version: through the lock (the lock may already know it lost) and with the raw fence
it held (only the store can refuse that), and prints one JSON line per outcome, then whether
the loss was signalled (event, callback, reason). Every wait is bounded.
"""

import json
import sys

from kvserver.client import Client
from kvserver.spark.commitlog import CommitLog
from kvserver.spark.fencing import FencedOutError
from kvserver.spark.lock import FencedLock


def say(**fields):
    print(json.dumps(fields), flush=True)


def attempt(log, version, fence, how):
    try:
        entry = log.commit(version, f"{how}".encode(), fence=fence)
        say(how=how, outcome="committed", version=entry.version)
    except FencedOutError as exc:
        say(how=how, outcome="fenced_out", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        say(how=how, outcome=type(exc).__name__, message=str(exc))


def main() -> int:
    endpoints, lock_name, table, ttl = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    calls = []
    with Client(endpoints.split(","), timeout_s=10) as client:
        lock = FencedLock(client, lock_name, ttl=ttl, on_lost=calls.append)
        fence = lock.acquire(timeout=30)
        log = CommitLog(client, table)
        entry = log.commit(log.next_version(), b"driver", fence=lock)
        say(ready=True, token=fence.token, version=entry.version)
        line = sys.stdin.readline().strip()
        if line != "commit":
            lock.release()
            return 0
        version = log.next_version()
        attempt(log, version, lock, "lock")
        attempt(log, version, fence, "raw_fence")
        lost = lock.lost.wait(15)
        say(lost=lost, reason=lock.lost_reason, callbacks=len(calls))
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
