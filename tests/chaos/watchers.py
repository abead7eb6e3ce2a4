"""Watchers of the chaos prefix, and a one-shot replay of the history from one member.

An :class:`Event` is ``(revision, type, key, value, create_revision)`` as a watch delivered
it (``revision`` is the kv's ``mod_revision``; a DELETE carries no value).

:class:`Watcher` (a thread) keeps one ``/v3/watch`` stream open on a random member, from
``start_revision``. When the stream breaks, is canceled, or stays silent for ``idle_s``
(a paused or cut-off member sends nothing), it reconnects to a random member from the last
revision it saw + 1 -- what etcd's clients do -- so, if the store keeps its promise, it sees
every change under the prefix once and in revision order. It records what it got; the
checks (:mod:`tests.chaos.checks`) judge it.

:func:`replay` opens one watch from ``start_revision`` on one member and reads until an
event at or past ``until_revision`` arrives (bounded by ``timeout_s``): that member's
applied history of the prefix, used as the reference and to compare replicas.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse

from tests.chaos import kvhttp as h

Event = tuple[int, str, str, str, int]


def _open(url: str, prefix: str, start_revision: int, timeout_s: float):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    body = {
        "create_request": {
            "key": h.b64(prefix),
            "range_end": h.b64(h.prefix_end(prefix)),
            "start_revision": str(start_revision),
        }
    }
    conn.request(
        "POST", "/v3/watch", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    if resp.status != 200:
        text = resp.read()[:300]
        conn.close()
        raise h.NoAnswer(f"watch answered {resp.status}: {text!r}")
    return conn, resp


def _events(result: dict) -> list[Event]:
    out = []
    for ev in result.get("events", []):
        kv = ev.get("kv", {})
        out.append(
            (
                int(kv.get("mod_revision", 0)),
                ev.get("type", "PUT"),
                h.unb64(kv.get("key")),
                h.unb64(kv.get("value")),
                int(kv.get("create_revision", 0)),
            )
        )
    return out


class Watcher:
    def __init__(
        self,
        name: str,
        endpoints: list[str],
        start_revision: int,
        seed: int,
        prefix: str = h.PREFIX,
        idle_s: float = 5.0,
    ):
        self.name = name
        self.endpoints = endpoints
        self.prefix = prefix
        self.next_revision = start_revision
        self.idle_s = idle_s
        self.rng = random.Random(f"{seed}-{name}")
        self.events: list[Event] = []
        self.reconnects = 0
        self.problems: list[str] = []
        self.stop_event = threading.Event()
        self._seen = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def last_revision(self) -> int:
        return self.next_revision - 1

    def _run(self) -> None:
        while not self.stop_event.is_set():
            url = self.endpoints[self.rng.randrange(len(self.endpoints))]
            try:
                self._conn, resp = _open(url, self.prefix, self.next_revision, self.idle_s)
                while not self.stop_event.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("compact_revision"):
                        self.problems.append(
                            f"{self.name}: compacted at {result['compact_revision']} (via {url})"
                        )
                    got = _events(result)
                    if got:
                        with self._seen:
                            self.events.extend(got)
                            self.next_revision = got[-1][0] + 1
                            self._seen.notify_all()
                    if result.get("canceled"):
                        break
            except (OSError, http.client.HTTPException, ValueError, h.NoAnswer):
                pass  # reconnect below: broken, silent or refused
            finally:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
            self.reconnects += 1
            self.stop_event.wait(0.05)

    def wait_for(self, revision: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while self.last_revision < revision:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._seen.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        self.stop_event.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(2)  # wake a blocked readline
            except OSError:
                pass
        self._thread.join(timeout=15)
        if self._thread.is_alive():
            self.problems.append(f"{self.name}: thread did not stop")


def replay(
    url: str,
    start_revision: int,
    until_revision: int,
    timeout_s: float = 60.0,
    prefix: str = h.PREFIX,
) -> list[Event]:
    """The prefix's events from ``start_revision`` through ``until_revision`` as ``url``'s
    member applied them; NoAnswer if the member does not deliver them within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    events: list[Event] = []
    conn, resp = _open(url, prefix, start_revision, min(10.0, timeout_s))
    try:
        while time.monotonic() < deadline:
            line = resp.readline()
            if not line:
                raise h.NoAnswer(
                    f"replay from {url}: stream ended at revision "
                    f"{events[-1][0] if events else None}"
                )
            if not line.strip():
                continue
            result = json.loads(line).get("result", {})
            if result.get("canceled") or result.get("compact_revision"):
                raise h.NoAnswer(f"replay from {url}: canceled ({result})")
            events.extend(_events(result))
            if events and events[-1][0] >= until_revision:
                return [e for e in events if e[0] <= until_revision]
    except (OSError, http.client.HTTPException) as exc:
        raise h.NoAnswer(f"replay from {url}: {exc!r}") from None
    finally:
        conn.close()
    raise h.NoAnswer(f"replay from {url}: revision {until_revision} not reached in {timeout_s}s")
