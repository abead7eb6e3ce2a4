"""Run simulation seeds and turn failures into one-line replay commands.

``run_seed(seed, nodes)`` never raises: it returns a ``SeedResult`` whose ``error`` holds the
failure (a checker's message, or the traceback of an unexpected exception from the core).
``nodes_for(seed)`` is the node count a multi-seed run uses when none is given: 3 for even
seeds, 5 for odd ones. ``replay_command`` is the exact command that reruns one seed.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

from tests.sim.cluster import Cluster
from tests.sim.scenario import TICK_SLOTS, Scenario


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    nodes: int
    error: str | None
    stats: dict
    digest: int

    @property
    def ok(self) -> bool:
        return self.error is None


def nodes_for(seed: int) -> int:
    return 3 if seed % 2 == 0 else 5


def replay_command(seed: int, nodes: int) -> str:
    return f"python -m tests.sim --seed {seed} --nodes {nodes} --verbose"


def run_seed(
    seed: int, nodes: int | None = None, log: Callable[[str], None] | None = None
) -> SeedResult:
    nodes = nodes_for(seed) if nodes is None else nodes
    sc = Scenario.from_seed(seed, nodes)
    if log:
        log(f"scenario: {sc.describe()}")
    cluster = Cluster(sc, log=log)
    error = None
    try:
        stats = cluster.run()
    except Exception as exc:  # checker violations (AssertionError), or the core raising
        stats = dict(cluster.stats)
        error = f"{type(exc).__name__} at tick {cluster.now // TICK_SLOTS}: {exc}"
        if log or not isinstance(exc, AssertionError):
            error += "\n" + traceback.format_exc()
    return SeedResult(seed, nodes, error, stats, cluster.digest(error))


def run_seeds(start: int, count: int, nodes: int | None = None) -> list[SeedResult]:
    return [run_seed(s, nodes) for s in range(start, start + count)]


def failure_report(failures: list[SeedResult]) -> str:
    lines = []
    for r in failures:
        lines.append(f"seed {r.seed} nodes {r.nodes}: {r.error.splitlines()[0]}")
        lines.append(f"  replay: {replay_command(r.seed, r.nodes)}")
    return "\n".join(lines)
