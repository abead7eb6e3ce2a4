"""The nemesis: faults injected into a :class:`~tests.chaos.members.ChaosCluster`.

Families (``--nemesis`` takes family or fault names, comma-separated):

========== ===================================================================================
kill       ``kill-leader``: SIGKILL the leader, wait for the first acknowledged write (the
           failover time), hold, restart it. ``kill-follower``: SIGKILL a follower, hold,
           restart it.
pause      ``pause-leader`` / ``pause-follower``: SIGSTOP, hold (longer than the election
           timeout, so a paused leader is replaced), SIGCONT: the member comes back with a
           stale view and must not act on it.
restart    ``restart-all``: SIGKILL every member at once, then start them all again (only the
           fsynced WAL survives).
partition  ``partition-leader``: cut the leader from both followers (it keeps its clients).
           ``partition-follower``: cut one follower off. ``partition-bridge``: cut one pair
           only, so the third member still talks to both (a non-transitive partition).
           With three members every majority/minority split is one member against two:
           that is ``partition-leader`` and ``partition-follower``.
========== ===================================================================================

Every fault starts from a healthy cluster with one agreed leader (bounded wait), is healed
after ``hold_s``, and is followed by a bounded wait for health again. Each gives a record
for the timeline: name, targets, start/heal/healthy times (seconds since the run began; a
partition starts once all its rules are in place, ``restart-all`` once the last member is
dead, ``inject_s`` after it was begun; on the Docker target a kill once the container
died and a pause once ``docker pause`` returned),
``recovery_s`` (fault start to the first acknowledged write invoked after it) and, for
``kill-leader``, ``failover_s`` (the same measure, the figure the reliability issue asks for).
"""

from __future__ import annotations

import random
import time

from tests.chaos.members import ChaosCluster, Member
from tests.chaos.netns import NetTopology
from tests.chaos.workloads import Prober

FAMILIES = {
    "kill": ["kill-leader", "kill-follower"],
    "pause": ["pause-leader", "pause-follower"],
    "restart": ["restart-all"],
    "partition": ["partition-leader", "partition-follower", "partition-bridge"],
}
ALL_FAULTS = [f for faults in FAMILIES.values() for f in faults]


def expand(spec: str) -> list[str]:
    """``"kill,pause,partition-bridge"`` -> fault names; ValueError for an unknown name."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            out += ALL_FAULTS
        elif part in FAMILIES:
            out += FAMILIES[part]
        elif part in ALL_FAULTS:
            out.append(part)
        else:
            raise ValueError(
                f"unknown nemesis {part!r}: use {', '.join(FAMILIES)}, all, "
                f"or one of {', '.join(ALL_FAULTS)}"
            )
    return list(dict.fromkeys(out))


def needs_network(faults: list[str]) -> bool:
    return any(f.startswith("partition-") for f in faults)


def healed_record(cluster, prober, rel, start: float, healthy_timeout_s: float) -> dict:
    """A fault just healed: wait (bounded) for a healthy cluster; the record's times (``rel``
    makes them relative to the run's start), the leader after, and ``recovery_s``: from
    ``start`` to the first acknowledged write invoked after it (None without a prober)."""
    healed = time.monotonic()
    lead_after = cluster.wait_healthy(healthy_timeout_s)
    healthy = time.monotonic()
    first = prober.first_ack_after(start) if prober is not None else None
    return {
        "start_s": rel(start),
        "heal_s": rel(healed),
        "healthy_s": rel(healthy),
        "leader_after": lead_after.name,
        "recovery_s": None if first is None else round(first - start, 3),
    }


def heal_everything(cluster, net) -> None:
    """Undo whatever a failed fault left behind: cuts, paused or dead members."""
    if net is not None:
        net.heal()
    for m in cluster.members:
        if m.paused:
            cluster.resume(m)
        if not m.alive():
            cluster.start_member(m)


class Nemesis:
    def __init__(
        self,
        cluster: ChaosCluster,
        net: NetTopology | None,
        prober: Prober,
        rng: random.Random,
        origin: float,
        hold_s: float = 3.0,
        healthy_timeout_s: float = 60.0,
        failover_timeout_s: float = 30.0,
    ):
        self.cluster = cluster
        self.net = net
        self.prober = prober
        self.rng = rng
        self.origin = origin
        self.hold_s = hold_s
        self.healthy_timeout_s = healthy_timeout_s
        self.failover_timeout_s = failover_timeout_s

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.origin, 3)

    def run(self, fault: str) -> dict:
        leader = self.cluster.wait_healthy(self.healthy_timeout_s)
        followers = [m for m in self.cluster.members if m is not leader]
        record: dict = {"fault": fault, "leader_before": leader.name}
        start = time.monotonic()
        kind, _, who = fault.partition("-")
        if kind == "kill":
            target = leader if who == "leader" else self.rng.choice(followers)
            out, start = self._kill(target, start, measure=who == "leader")
            record.update(out)
        elif kind == "pause":
            target = leader if who == "leader" else self.rng.choice(followers)
            record["targets"] = [target.name]
            start = self._took_effect(self.cluster.pause(target), start, record)
            time.sleep(self.hold_s)  # the fault's duration, not a wait for a condition
            self.cluster.resume(target)
        elif kind == "restart":
            record["targets"] = [m.name for m in self.cluster.members]
            for m in self.cluster.members:
                self.cluster.kill(m)
            # the members die one after the other: the outage starts when the last is gone
            record["inject_s"] = round(time.monotonic() - start, 3)
            start = time.monotonic()
            time.sleep(1.0)  # the cluster's down time
            self.cluster.start()
        elif kind == "partition":
            if self.net is None:
                raise RuntimeError("partitions need network namespaces")
            if who == "leader":
                target = leader
                self.net.isolate(target.index)
                record["targets"] = [target.name]
            elif who == "follower":
                target = self.rng.choice(followers)
                self.net.isolate(target.index)
                record["targets"] = [target.name]
            else:
                a, b = self.rng.sample(self.cluster.members, 2)
                self.net.partition({frozenset((a.index, b.index))})
                record["targets"] = [a.name, b.name]
            # installing the rules takes a few hundred ms under load: the fault starts
            # when the cut is complete (writes acknowledged before that prove nothing)
            record["inject_s"] = round(time.monotonic() - start, 3)
            start = time.monotonic()
            time.sleep(self.hold_s)
            self.net.heal()
        else:
            raise ValueError(f"unknown fault {fault!r}")
        record.update(
            healed_record(self.cluster, self.prober, self.rel, start, self.healthy_timeout_s)
        )
        return record

    @staticmethod
    def _took_effect(at: float | None, start: float, record: dict) -> float:
        """The fault's start: when the cluster says it took effect (the Docker target: a
        ``docker`` command needs a few hundred ms, and a write the leader acknowledges in
        that time proves nothing), else when it was begun (a signal: at once)."""
        if at is None:
            return start
        record["inject_s"] = round(at - start, 3)
        return at

    def _kill(self, target: Member, start: float, measure: bool) -> tuple[dict, float]:
        out: dict = {"targets": [target.name]}
        start = self._took_effect(self.cluster.kill(target), start, out)
        if measure:
            deadline = start + self.failover_timeout_s
            first = self.prober.first_ack_after(start)
            while first is None and time.monotonic() < deadline:
                time.sleep(0.02)  # polling the prober's record, bounded by the deadline
                first = self.prober.first_ack_after(start)
            out["failover_s"] = None if first is None else round(first - start, 3)
        left = self.hold_s - (time.monotonic() - start)
        if left > 0:
            time.sleep(left)
        self.cluster.start_member(target)
        return out, start

    def heal_everything(self) -> None:
        heal_everything(self.cluster, self.net)
