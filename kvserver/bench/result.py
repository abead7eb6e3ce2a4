"""What a bench run gives back and how it finds its target, shared by every load runner.

``BenchResult`` is the outcome of a run (per-kind ``Stats``, merged exactly), ``BenchError``
says why a run could not be done. ``resolve_endpoints`` applies ``--target-leader``: it asks
each endpoint's ``/v3/maintenance/status`` which member leads (``find_leader``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvserver.bench.stats import Stats, Summary
from kvserver.bench.workloads import BenchOptions


class BenchError(RuntimeError):
    """The run could not be done (no endpoint answers, no leader, watch unsupported...)."""


@dataclass
class BenchResult:
    opts: BenchOptions
    by_kind: dict[str, Stats] = field(default_factory=dict)
    endpoints_used: list[str] = field(default_factory=list)

    @property
    def stats(self) -> Stats:
        return Stats.merge_all(self.by_kind.values())

    def summary(self) -> Summary:
        return self.stats.summary()

    def to_json(self) -> dict:
        out = {
            "workload": self.opts.op,
            "options": asdict(self.opts),
            "endpoints_used": self.endpoints_used,
            **self.summary().to_json(),
        }
        if len(self.by_kind) > 1:
            out["by_kind"] = {k: s.summary().to_json() for k, s in sorted(self.by_kind.items())}
        return out


# --- the leader --------------------------------------------------------------------------


def post_json(url: str, path: str, body: dict, timeout_s: float = 2.0, context=None) -> dict:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
        return json.loads(resp.read())


def serving(url: str, timeout_s: float = 1.0) -> bool:
    """The member at ``url`` is healthy and its client front ends (if it has any) all serve
    (``/health`` says ``"frontends": "N/N"``). Until they do it accepts clients itself, and
    sends them to a front end once one is ready."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as resp:
            body = json.loads(resp.read() or b"{}")
    except (OSError, ValueError):  # an HTTP error (503: unhealthy) included
        return False
    ready, _, configured = str(body.get("frontends", "0/0")).partition("/")
    return ready == configured


def find_leader(
    endpoints: list[str],
    timeout_s: float = 10.0,
    ssl_for: Callable[[str], object] = lambda url: None,
) -> str:
    """The endpoint whose member is the leader (polls until one says so, or BenchError)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    while True:
        for url in endpoints:
            try:
                st = post_json(url, "/v3/maintenance/status", {}, context=ssl_for(url))
                leader, me = (
                    str(st.get("leader", "0")),
                    str(st.get("header", {}).get("member_id", "")),
                )
                if leader not in ("", "0") and leader == me:
                    return url
                seen[url] = f"leader is {leader}"
            except (OSError, ValueError) as exc:
                seen[url] = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise BenchError(
                "no leader among the endpoints: "
                + "; ".join(f"{u}: {why}" for u, why in seen.items())
            )
        time.sleep(0.1)


def resolve_endpoints(opts: BenchOptions) -> list[str]:
    if opts.target_leader:
        return [find_leader(opts.endpoints, ssl_for=opts.ssl_for)]
    return list(opts.endpoints)
