"""One chaos run: a cluster, the workloads, the nemesis schedule, the checks, the report.

:func:`run` starts three real members (in network namespaces on a bridge when the machine
allows it -- required when a partition fault is asked for -- otherwise on loopback), starts
every workload and two watchers, then injects faults (the requested ones, shuffled per
cycle with ``seed``) until ``duration_s`` has passed -- but at least one whole cycle, so
every requested fault runs once -- then ``failover_kills`` more leader SIGKILLs. It heals everything, stops the workloads, writes a final sentinel key, and judges:
(``target="compose"``: the members are deploy/docker-compose.yml's containers and the
faults Docker's, see tests/chaos/docker_members.py; same workloads, checks and report, and
``cleanup`` lists what ``down -v`` left of the project.)

- acknowledged writes lost (each acked ``(key, revision)`` must be in the history),
- the register history's linearizability (tests/lincheck, bounded by ``check_timeout_s``:
  UNKNOWN is reported as such, never as a pass),
- every bank snapshot read totals the initial amount, also each member's final state,
- fencing of the lock's resource writes (holders never overlap),
- each watcher saw exactly the reference history (in order, once),
- every member's replay of the history is identical,
- no member exited unless the nemesis killed it; the cluster recovered after every fault.

The report (a dict, also written as ``report.json`` with ``timeline.png`` next to it) has
``ok`` and ``problems``; a caller asserts on the individual figures. Namespaces, bridge,
FORWARD rule and processes are removed in ``finally`` whatever happens (and at exit).
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import random
import time
from dataclasses import asdict, dataclass, field

from tests.chaos import checks, kvgrpc, netns
from tests.chaos import kvhttp as h
from tests.chaos.members import ChaosCluster
from tests.chaos.nemesis import Nemesis, expand, needs_network
from tests.chaos.watchers import Watcher, replay
from tests.chaos.workloads import Bank, LockWorkload, Prober, Recorder, Register
from tests.lincheck import KvModel, check
from tests.support.wait import WaitTimeout, wait_for


class ChaosUnavailable(RuntimeError):
    """This machine cannot run the requested faults (the message says why)."""


@dataclass
class ChaosConfig:
    duration_s: float = 60.0
    nemesis: str = "kill,pause,restart,partition"
    out_dir: str = "chaos-out"
    seed: int = 1
    hold_s: float = 3.0  # how long each fault lasts
    gap_s: float = 1.0  # quiet time between two faults
    failover_kills: int = 0  # extra leader SIGKILLs after the schedule
    network: str = "auto"  # auto | netns | loopback (target "process" only)
    target: str = "process"  # process: raftkv serve processes; compose: deploy/'s containers
    register_clients: int = 5
    register_keys: int = 5
    register_over_grpc: bool = False  # the register workload speaks gRPC, not the gateway
    bank_clients: int = 3  # one of them only reads
    lock_clients: int = 3
    watchers: int = 2
    check_timeout_s: float = 180.0
    extra_args: list[str] = field(default_factory=list)


def _put_retrying(endpoints: list[str], key: str, value: str, timeout_s: float) -> int:
    """Revision of an acknowledged put, trying members in turn (bounded)."""
    deadline = time.monotonic() + timeout_s
    i = 0
    last = ""
    while time.monotonic() < deadline:
        try:
            code, body = h.put(endpoints[i % len(endpoints)], key, value, 5.0)
            if code == 200:
                return h.revision_of(body)
            last = f"{code} {body}"
        except h.NoAnswer as exc:
            last = str(exc)
        i += 1
        time.sleep(0.2)
    raise AssertionError(f"put {key} not acknowledged in {timeout_s}s: {last}")


def compose_faults(spec: str) -> tuple[list[str], dict[str, str]]:
    """The faults of ``spec`` the compose target can inject, and those it leaves out (with
    the reason) because a family or ``all`` named them; naming one alone is an error."""
    from tests.chaos.docker_members import UNSUPPORTED_FAULTS

    named = {p.strip() for p in spec.split(",")}
    asked = [f for f in UNSUPPORTED_FAULTS if f in named]
    if asked:
        raise ChaosUnavailable(f"{asked[0]}: {UNSUPPORTED_FAULTS[asked[0]]}")
    faults = expand(spec)
    return (
        [f for f in faults if f not in UNSUPPORTED_FAULTS],
        {f: UNSUPPORTED_FAULTS[f] for f in faults if f in UNSUPPORTED_FAULTS},
    )


def run(cfg: ChaosConfig) -> dict:
    if cfg.target == "compose":
        return _run_compose(cfg)
    if cfg.target != "process":
        raise ValueError(f"unknown target {cfg.target!r}: process or compose")
    faults = expand(cfg.nemesis)
    if not faults:
        raise ValueError("no nemesis selected")
    reason = None if cfg.network == "loopback" else netns.unavailable_reason()
    if cfg.network == "netns" and reason:
        raise ChaosUnavailable(reason)
    if needs_network(faults) and (reason or cfg.network == "loopback"):
        raise ChaosUnavailable(
            f"partition faults need network namespaces: "
            f"{reason or 'network=loopback was asked for'}"
        )
    os.makedirs(cfg.out_dir, exist_ok=True)
    rng = random.Random(cfg.seed)
    report: dict = {
        "config": asdict(cfg),
        "faults_requested": faults,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_at_start": os.getloadavg(),
        },
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    problems: list[str] = []
    net = None
    cluster = None
    try:
        if reason is None:
            netns.collect_garbage()
            net = netns.NetTopology(3).create()
        cluster = ChaosCluster(os.path.join(cfg.out_dir, "data"), 3, net, cfg.extra_args)
        report["network"] = (
            {
                "mode": "netns",
                "subnet": str(net.network),
                "bridge": net.bridge,
                "namespaces": net.namespaces,
            }
            if net
            else {"mode": "loopback"}
        )
        report["members"] = {m.name: m.client_url for m in cluster.members}
        cluster.start()
        cluster.wait_healthy(90)
        _run_schedule(cfg, cluster, net, faults, rng, report, problems)
    finally:
        if cluster is not None:
            cluster.stop()
        if net is not None:
            errors = net.close()
            left = net.leftovers()
            report["cleanup"] = {"errors": errors, "leftovers": left}
            if errors or left:
                problems.append(f"cleanup left {left} ({errors})")
    return _finish(cfg, report, problems)


def _run_compose(cfg: ChaosConfig) -> dict:
    """The same run against deploy/docker-compose.yml's three containers, with Docker's
    faults (tests/chaos/docker_members.py); ``down -v`` and a leftover check at the end."""
    from tests.chaos.docker_members import compose_members, leftovers

    faults, left_out = compose_faults(cfg.nemesis)
    if not faults:
        raise ValueError("no nemesis selected")
    if cfg.extra_args:
        raise ValueError(
            "--server-arg is for the process target: the containers take their "
            "flags from deploy/docker-compose.yml"
        )
    os.makedirs(cfg.out_dir, exist_ok=True)
    rng = random.Random(cfg.seed)
    report: dict = {
        "config": asdict(cfg),
        "faults_requested": faults,
        "faults_left_out": left_out,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_at_start": os.getloadavg(),
        },
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    problems: list[str] = []
    project = docker = None
    with compose_members(os.path.join(cfg.out_dir, "data")) as cluster:
        project, docker = cluster.compose.project, cluster.compose.docker
        report["network"] = {"mode": "compose", "project": project, "network": cluster.network.name}
        report["members"] = {m.name: m.client_url for m in cluster.members}
        try:
            cluster.wait_healthy(90)
            _run_schedule(cfg, cluster, cluster.network, faults, rng, report, problems)
        finally:
            cluster.stop()
    left = leftovers(docker, project)
    report["cleanup"] = {"errors": [], "leftovers": left}
    if left:
        problems.append(f"compose down -v left {left}")
    return _finish(cfg, report, problems)


def _finish(cfg: ChaosConfig, report: dict, problems: list[str]) -> dict:
    report["problems"] = problems
    report["ok"] = not problems
    series = report.pop("series", None)
    if series is not None:
        try:
            from tests.chaos.plot import plot_timeline

            report["png"] = os.path.join(cfg.out_dir, "timeline.png")
            plot_timeline(report, series, report["png"])
        except ImportError as exc:  # matplotlib missing: the JSON is the result
            report["png"] = f"not drawn: {exc}"
        with open(os.path.join(cfg.out_dir, "operations.json"), "w") as f:
            json.dump(series, f)
    with open(os.path.join(cfg.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    return report


def _run_schedule(cfg, cluster, net, faults, rng, report, problems) -> None:
    endpoints = cluster.endpoints
    recorder = Recorder()
    start_rev = _put_retrying(endpoints, f"{h.PREFIX}start", "1", 60)
    origin = time.monotonic()
    register = Register(
        endpoints,
        recorder,
        cfg.seed,
        cfg.register_clients,
        keys=cfg.register_keys,
        over_grpc=cfg.register_over_grpc,
    )
    bank = Bank(endpoints, recorder, cfg.seed, cfg.bank_clients)
    bank.setup(endpoints[0])
    lock = LockWorkload(endpoints, recorder, cfg.seed, cfg.lock_clients)
    prober = Prober(endpoints, recorder)
    watchers = [
        Watcher(f"watcher{i + 1}", endpoints, start_rev, cfg.seed) for i in range(cfg.watchers)
    ]
    workloads = [register, bank, lock]
    for w in [*watchers, *workloads, prober]:
        w.start()
    nemesis = Nemesis(cluster, net, prober, rng, origin, hold_s=cfg.hold_s)
    timeline: list[dict] = []
    report["timeline"] = timeline
    try:
        try:
            wait_for(lambda: len(recorder.ops) >= 100, 60, "100 operations", interval_s=0.1)
        except WaitTimeout:
            problems.append("fewer than 100 operations in the first 60 s before any fault")
        cycle: list[str] = []
        schedule_end = origin + cfg.duration_s
        kills_left = cfg.failover_kills
        cycles = 0
        while True:
            if not cycle and time.monotonic() < schedule_end:
                cycle = list(faults)
                rng.shuffle(cycle)
                cycles += 1
            # the first cycle always completes: every requested fault runs at least once
            if cycle and (time.monotonic() < schedule_end or cycles == 1):
                fault = cycle.pop()
            elif kills_left > 0:
                kills_left -= 1
                fault = "kill-leader"
            else:
                break
            try:
                timeline.append(nemesis.run(fault))
            except AssertionError as exc:  # no recovery within the bound, or a member died
                problems.append(f"{fault}: {exc}")
                timeline.append(
                    {
                        "fault": fault,
                        "error": str(exc)[:2000],
                        "start_s": nemesis.rel(time.monotonic()),
                    }
                )
                nemesis.heal_everything()
                break
            time.sleep(cfg.gap_s)  # quiet time between faults, part of the schedule
    finally:
        nemesis.heal_everything()
    try:
        cluster.wait_healthy(90)
    except AssertionError as exc:
        problems.append(f"no healthy cluster after healing: {exc}")
    for w in [*workloads, prober]:
        w.stop()
    report["end_s"] = round(time.monotonic() - origin, 3)
    # Fresh gRPC channels: one to a member that was killed may still be waiting out its
    # reconnect backoff, failing calls at once although the member is healthy again.
    kvgrpc.close_all()
    register.final_reads(endpoints[0])
    kvgrpc.close_all()
    until_rev = _put_retrying(endpoints, f"{h.PREFIX}end", "1", 60)

    # --- the replicated history, once from every member ------------------------------------
    histories = {}
    for m in cluster.members:
        try:
            histories[m.name] = replay(m.client_url, start_rev, until_rev, timeout_s=90)
        except h.NoAnswer as exc:
            problems.append(f"history of {m.name}: {exc}")
    reference = next(iter(histories.values()), [])
    replica = checks.replica_problems(histories) if len(histories) > 1 else []
    problems += replica

    # --- watchers --------------------------------------------------------------------------
    watch_report = []
    for w in watchers:
        caught_up = w.wait_for(until_rev, 90)
        w.stop()
        wp = (
            []
            if caught_up
            else [f"{w.name}: stopped at revision {w.last_revision}, expected {until_rev}"]
        )
        wp += w.problems + checks.watch_problems(w.name, w.events, reference, until_rev)
        problems += wp
        watch_report.append(
            {"name": w.name, "events": len(w.events), "reconnects": w.reconnects, "problems": wp}
        )

    # --- acknowledged writes ---------------------------------------------------------------
    lost = checks.lost_writes(recorder.acked_writes, reference) if reference else ["no history"]
    if lost:
        problems.append(f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}")

    # --- bank: every member's final state too ----------------------------------------------
    for i, url in enumerate(endpoints):
        try:
            code, body = h.get_prefix(url, f"{h.PREFIX}bank/", 10, serializable=True)
            if code == 200:
                bank.check_snapshot(body, f"final serializable read of member {i}")
            else:
                problems.append(f"final bank read of member {i}: {code}")
        except h.NoAnswer as exc:
            problems.append(f"final bank read of member {i}: {exc}")
    if bank.violations:
        problems.append(
            f"bank total changed in {len(bank.violations)} reads, e.g. {bank.violations[:3]}"
        )

    # --- lock ------------------------------------------------------------------------------
    fenced, fence_violations = checks.fencing_violations(
        reference, lock.LOCK_KEY, lock.RESOURCE_KEY
    )
    problems += fence_violations
    if lock.acquired == 0 or fenced == 0:
        problems.append(
            f"the lock workload did nothing (acquired {lock.acquired}, fenced writes {fenced})"
        )

    # --- linearizability -------------------------------------------------------------------
    with open(os.path.join(cfg.out_dir, "register-history.pickle"), "wb") as f:
        pickle.dump(register.history.operations(), f)  # for tests.lincheck offline
    t0 = time.monotonic()
    result = check(KvModel(), register.history, timeout_s=cfg.check_timeout_s)
    lin = {
        "verdict": result.verdict.name,
        "operations": result.operation_count,
        "steps": result.steps,
        "check_s": round(time.monotonic() - t0, 2),
        "violations": sum(p.verdict.name == "ILLEGAL" for p in result.partitions),
        "pending": sum(op.pending for op in register.history.operations()),
    }
    if not result.ok:
        lin["explanation"] = result.explanation[:5000]
        problems.append(f"linearizability: {result.verdict.name}")

    problems += recorder.problems
    ops = recorder.ops
    by_workload: dict[str, dict[str, int]] = {}
    for op in ops:
        counts = by_workload.setdefault(op.workload, {"ok": 0, "fail": 0, "unknown": 0})
        counts[op.outcome] += 1
    failovers = [r["failover_s"] for r in timeline if r.get("failover_s") is not None]
    missing_failovers = sum(1 for r in timeline if "failover_s" in r and r["failover_s"] is None)
    if missing_failovers:
        problems.append(
            f"{missing_failovers} leader kills without an acknowledged write "
            f"within {nemesis.failover_timeout_s}s"
        )
    recoveries = [r["recovery_s"] for r in timeline if r.get("recovery_s") is not None]
    report.update(
        {
            "rounds": sum(1 for r in timeline if "error" not in r),
            "ops": {"total": len(ops), "by_workload": by_workload},
            "acked_writes": len(recorder.acked_writes),
            "lost_writes": len(lost),
            "lost_examples": lost[:20],
            "linearizability": lin,
            "bank": {
                "reads_checked": bank.reads,
                "violations": len(bank.violations),
                "examples": bank.violations[:5],
                "total": bank.total,
                "serializable_before_setup": bank.before_setup,
                "serializable_went_back": bank.went_back_count,
                "went_back_examples": bank.went_back[:5],
            },
            "lock": {
                "acquisitions": lock.acquired,
                "guarded_writes_acked": lock.guarded_ok,
                "guarded_writes_fenced_off": lock.guarded_rejected,
                "fenced_writes_checked": fenced,
                "overlaps": len(fence_violations),
                "examples": fence_violations[:5],
            },
            "watch": {
                "watchers": watch_report,
                "reference_events": len(reference),
                "complete_and_ordered": all(not w["problems"] for w in watch_report),
            },
            "replicas": {
                "members_replayed": len(histories),
                "identical": not replica,
                "problems": replica,
            },
            "failover": {
                "definition": "leader SIGKILL -> first acknowledged put invoked after it",
                "kills": len(failovers),
                "samples_s": failovers,
                "p50_s": checks.percentile(failovers, 50),
                "p99_s": checks.percentile(failovers, 99),
                "max_s": max(failovers, default=None),
            },
            "recovery_any_fault": {
                "p50_s": checks.percentile(recoveries, 50),
                "p99_s": checks.percentile(recoveries, 99),
            },
            "series": _series(ops, origin),
            "revisions": {"start": start_rev, "end": until_rev},
        }
    )


def _series(ops, origin: float) -> dict:
    """Per-operation points for the plot: time since start, latency, outcome, workload."""
    ops = sorted(ops, key=lambda o: o.start)
    return {
        "t_s": [round(o.start - origin, 3) for o in ops],
        "latency_s": [round(o.end - o.start, 4) for o in ops],
        "outcome": [o.outcome for o in ops],
        "workload": [o.workload for o in ops],
    }
