"""The soak: rounds of every nemesis against a cluster holding many keys, three or five
members, with the register and bank workloads running throughout.

``python -m tests.chaos --soak --rounds 100 --keys 1000000 --members 3 --out DIR``

One cluster for the whole run. It is loaded with ``keys`` keys first (outside the prefix
the checks read, so each round's checks stay small), then written to with small puts until
every member has made a snapshot (as a long-running cluster has), then each round runs every fault of
``SOAK_FAULTS`` once, in a shuffled order, each from a healthy cluster and followed by a
bounded wait for health again. With five members every fault hits two members at once
(two killed, paused, cut off, two disks full, two fsyncs failing, two disks slow; the
leader and a follower for the ``-leader`` faults): a quorum of three remains.

=================== ===========================================================================
kill-*, pause-*     SIGKILL (restarted after ``hold_s``) / SIGSTOP (resumed after ``hold_s``)
restart-all         every member SIGKILLed at once, then started again
partition-*         the target(s) cut from every other member (network namespaces; left out,
                    and said so in the report, where the machine has none)
disk-full-*         the WAL's ``pwrite`` fails with ENOSPC (the disk shim of tests.faults):
                    the member stops, saying the disk is full; it is started again once the
                    shim is cleared, as an operator would after freeing space
fsync-fail-*        ``fdatasync`` fails with EIO: the member stops without retrying it; started
                    again, it replays its WAL
slow-disk-*         every ``fdatasync`` takes 500 ms for ``hold_s`` plus five seconds: a slow
                    leader hands leadership away (kvserver.server.disk_health)
clock-step          every member's wall clock one hour ahead for ``hold_s``, then back
                    (libfaketime; the monotonic clock is left alone)
=================== ===========================================================================

Per round (``report.json``'s ``rounds``): the faults with their targets, acknowledged and
lost operations (each acknowledged write of the round looked up in the round's history as
one member replays it), whether the round's register history is linearizable
(tests.lincheck, bounded; UNKNOWN is reported as such; the history is kept as
``register-history-<round>.pickle``), bank reads that saw a total other
than the initial one (the bank runs across rounds: transfers in txns, reads of all
accounts at one revision, as Jepsen's bank test), and the time to recover (fault to the
first acknowledged write invoked after it; p50 and max over the round's faults). A plot of
the whole run (tests.chaos.plot) is written beside it.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from tests.chaos import checks, netns
from tests.chaos import kvhttp as h
from tests.chaos.members import ChaosCluster, Member
from tests.chaos.nemesis import heal_everything, healed_record
from tests.chaos.runner import _put_retrying
from tests.chaos.watchers import replay
from tests.chaos.workloads import Bank, Prober, Recorder, Register
from tests.faults import shims
from tests.lincheck import KvModel, check
from tests.support.scale import metrics

SOAK_FAULTS = [
    "kill-leader",
    "kill-follower",
    "pause-leader",
    "pause-follower",
    "restart-all",
    "partition-leader",
    "partition-follower",
    "disk-full-leader",
    "disk-full-follower",
    "fsync-fail-leader",
    "fsync-fail-follower",
    "slow-disk-leader",
    "slow-disk-follower",
    "clock-step",
]
PRELOAD_PREFIX = "soak-preload/"
PRELOAD_TXN_PUTS = 100
SLOW_DISK_MS = 500
SLOW_DISK_EXTRA_S = 5.0  # a slow disk lasts longer than other faults: the transfer shows


@dataclass
class SoakConfig:
    rounds: int = 100
    keys: int = 1_000_000
    members: int = 3
    out_dir: str = "soak-out"
    seed: int = 1
    hold_s: float = 3.0
    gap_s: float = 1.0
    faults: list[str] = field(default_factory=lambda: list(SOAK_FAULTS))
    register_clients: int = 4
    bank_clients: int = 3
    check_timeout_s: float = 60.0
    healthy_timeout_s: float = 120.0
    time_limit_s: float | None = None  # no round starts after this long; the report says so
    extra_args: list[str] = field(default_factory=list)


def snapshot_count(keys: int) -> int:
    """The soak's ``--snapshot-count``: the preload's entries, at most 10,000 (what the
    million-key benchmark sets), at least 1,000."""
    return min(10_000, max(1_000, keys // PRELOAD_TXN_PUTS))


def snapshots_made(url: str) -> int:
    """Snapshots a member has made since it started (``raftkv_snapshots_made_total``)."""
    return int(
        sum(v for k, v in metrics(url).items() if k.startswith("raftkv_snapshots_made_total"))
    )


def until_snapshotted(endpoints: list[str], timeout_s: float, threads: int = 8) -> int:
    """Small puts until every member has made a snapshot since it started; how many it took.
    The preload alone can stay under a member's threshold (each member's is up to a quarter
    above ``--snapshot-count``), and a member restarted before its first snapshot replays
    the whole preload: minutes at a million keys, which is not what a long-running cluster
    does. Bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    puts = 0
    with ThreadPoolExecutor(threads) as pool:
        while not all(snapshots_made(url) for url in endpoints):
            if time.monotonic() > deadline:
                raise AssertionError(f"no snapshot on every member after {puts} filler puts")
            batch = [(endpoints[(puts + i) % len(endpoints)], puts + i) for i in range(200)]
            list(pool.map(lambda a: h.put(a[0], f"{PRELOAD_PREFIX}fill/{a[1]}", "f", 30.0), batch))
            puts += len(batch)
    return puts


def preload(endpoints: list[str], keys: int, threads: int = 8) -> float:
    """Put ``keys`` keys (txns of PRELOAD_TXN_PUTS puts); seconds taken."""
    started = time.monotonic()
    batches = range(0, keys, PRELOAD_TXN_PUTS)

    def one(first: int) -> None:
        ops = [
            h.put_op(f"{PRELOAD_PREFIX}{i:08d}", f"value-{i:08d}")
            for i in range(first, min(keys, first + PRELOAD_TXN_PUTS))
        ]
        for attempt in range(20):
            url = endpoints[(first // PRELOAD_TXN_PUTS + attempt) % len(endpoints)]
            try:
                code, _ = h.txn(url, [], ops, 30.0)
            except h.NoAnswer:
                code = 0
            if code == 200:
                return
            time.sleep(0.5)
        raise AssertionError(f"preload batch at {first} not acknowledged")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, batches))
    return time.monotonic() - started


class SoakNemesis:
    """Injects one soak fault (on one member, or two with five members) and heals it."""

    def __init__(self, cfg, cluster: ChaosCluster, net, controls, clock_file, rng, origin):
        self.cfg = cfg
        self.cluster = cluster
        self.net = net
        self.controls = controls  # member name -> disk shim control file
        self.clock_file = clock_file
        self.rng = rng
        self.origin = origin
        self.prober: Prober | None = None
        self.width = 2 if len(cluster.members) >= 5 else 1

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.origin, 3)

    def _targets(self, leader: Member, who: str) -> list[Member]:
        followers = [m for m in self.cluster.members if m is not leader]
        if who == "leader":
            return [leader, *self.rng.sample(followers, self.width - 1)]
        return self.rng.sample(followers, self.width)

    def run(self, fault: str) -> dict:
        cluster, hold = self.cluster, self.cfg.hold_s
        leader = cluster.wait_healthy(self.cfg.healthy_timeout_s)
        if fault in ("restart-all", "clock-step"):
            kind, who = fault.split("-")[0] if fault == "restart-all" else fault, ""
        else:
            kind, who = fault.rsplit("-", 1)
        record: dict = {"fault": fault, "leader_before": leader.name}
        targets = self._targets(leader, who) if who else list(cluster.members)
        record["targets"] = [m.name for m in targets]
        start = time.monotonic()
        if kind in ("kill", "pause"):
            on, off = {
                "kill": (cluster.kill, cluster.start_member),
                "pause": (cluster.pause, cluster.resume),
            }[kind]
            for m in targets:
                on(m)
            time.sleep(hold)
            for m in targets:
                off(m)
        elif kind == "restart":
            for m in targets:
                cluster.kill(m)
            record["inject_s"] = round(time.monotonic() - start, 3)
            start = time.monotonic()
            time.sleep(1.0)
            cluster.start()
        elif kind == "partition":
            if self.net is None:
                raise RuntimeError("partitions need network namespaces")
            if len(targets) == 1:
                self.net.isolate(targets[0].index)
            else:
                others = [m for m in cluster.members if m not in targets]
                self.net.partition(
                    {frozenset((t.index, o.index)) for t in targets for o in others}
                    | {frozenset((targets[0].index, targets[1].index))}
                )
            record["inject_s"] = round(time.monotonic() - start, 3)
            start = time.monotonic()
            time.sleep(hold)
            self.net.heal()
        elif kind in ("disk-full", "fsync-fail"):
            for m in targets:
                if kind == "disk-full":
                    shims.set_failure(self.controls[m.name], pwrite_errno=errno.ENOSPC)
                else:
                    shims.set_failure(self.controls[m.name], fdatasync_errno=errno.EIO)
            stopped = self._wait_stopped(targets, 30.0)
            record["stopped"] = stopped
            for m in targets:
                shims.set_delay(self.controls[m.name], 0)
            left = hold - (time.monotonic() - start)
            if left > 0:
                time.sleep(left)
            for m in targets:
                if m.alive():  # it never wrote meanwhile: stop it as the fault would
                    cluster.kill(m)
                cluster.start_member(m)
        elif kind == "slow-disk":
            for m in targets:
                shims.set_delay(self.controls[m.name], SLOW_DISK_MS)
            time.sleep(hold + SLOW_DISK_EXTRA_S)
            record["leader_during"] = getattr(cluster.leader(), "name", None)
            for m in targets:
                shims.set_delay(self.controls[m.name], 0)
        elif kind == "clock-step":
            shims.set_offset(self.clock_file, "+3600")
            time.sleep(hold)
            shims.set_offset(self.clock_file, "+0")
        else:
            raise ValueError(f"unknown soak fault {fault!r}")
        record.update(
            healed_record(cluster, self.prober, self.rel, start, self.cfg.healthy_timeout_s)
        )
        return record

    def _wait_stopped(self, targets: list[Member], timeout_s: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(m.alive() for m in targets):
            time.sleep(0.05)  # polling the processes, bounded by the deadline
        return {m.name: (m.proc.returncode if m.proc and not m.alive() else None) for m in targets}

    def heal_everything(self) -> None:
        shims.set_offset(self.clock_file, "+0")
        for m in self.cluster.members:
            shims.set_delay(self.controls[m.name], 0)
        heal_everything(self.cluster, self.net)


def run_soak(cfg: SoakConfig) -> dict:
    os.makedirs(cfg.out_dir, exist_ok=True)
    rng = random.Random(cfg.seed)
    faults = list(cfg.faults)
    unknown = [f for f in faults if f not in SOAK_FAULTS]
    if unknown:
        raise ValueError(f"unknown soak faults {unknown}: use {', '.join(SOAK_FAULTS)}")
    report: dict = {"config": asdict(cfg), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    reason = netns.unavailable_reason()
    if reason is not None:
        left_out = [f for f in faults if f.startswith("partition-")]
        faults = [f for f in faults if f not in left_out]
        report["faults_left_out"] = {f: reason for f in left_out}
    report["faults"] = faults
    lib = shims.build_slowsync(cfg.out_dir)
    clock_file = os.path.join(cfg.out_dir, "clock-offset")
    env = shims.faketime_env(clock_file)
    controls = {
        f"node{i + 1}": os.path.join(cfg.out_dir, f"disk-node{i + 1}") for i in range(cfg.members)
    }
    net = cluster = None
    problems: list[str] = []
    try:
        if reason is None:
            netns.collect_garbage()
            net = netns.NetTopology(cfg.members).create()
        # One slow-disk transfer per member per minute is the default; a round puts slow
        # disks on the same member closer than that. Snapshots every 10,000 entries at a
        # million keys, as the million-key benchmark sets them: at the defaults a million
        # preloaded keys stay under the first snapshot, and every restart replays them all
        # (a minute or more a member).
        args = [
            "--slow-disk-transfer-interval",
            "5000",
            "--snapshot-count",
            str(snapshot_count(cfg.keys)),
            *cfg.extra_args,
        ]
        cluster = ChaosCluster(
            os.path.join(cfg.out_dir, "data"), cfg.members, net, args, token="raftkv-soak"
        )
        for m in cluster.members:
            member_env = dict(env, **shims.slowsync_env(lib, controls[m.name]))
            member_env["LD_PRELOAD"] = f"{lib} {shims.FAKETIME_LIB}"
            cluster.member_env[m.name] = member_env
        cluster.start()
        cluster.wait_healthy(cfg.healthy_timeout_s)
        report["preload_s"] = round(preload(cluster.endpoints, cfg.keys), 1)
        report["filler_puts"] = until_snapshotted(cluster.endpoints, cfg.healthy_timeout_s)
        _rounds(cfg, cluster, net, controls, clock_file, faults, rng, report, problems)
    finally:
        if cluster is not None:
            cluster.stop()
        if net is not None:
            errors = net.close()
            if errors or net.leftovers():
                problems.append(f"cleanup left {net.leftovers()} ({errors})")
    report["problems"] = problems
    report["ok"] = not problems
    with open(os.path.join(cfg.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    return report


def _rounds(cfg, cluster, net, controls, clock_file, faults, rng, report, problems) -> None:
    """The rounds. Each round's history runs from the revision after the previous round's
    last one through a marker put after the round: rounds are contiguous, so the bank's
    transfers, which go on between rounds, are each checked in exactly one of them (the
    last ones after the bank stops)."""
    endpoints = cluster.endpoints
    origin = time.monotonic()
    nemesis = SoakNemesis(cfg, cluster, net, controls, clock_file, rng, origin)
    bank_recorder = Recorder()
    bank = Bank(endpoints, bank_recorder, cfg.seed, cfg.bank_clients)
    bank.setup(endpoints[0])
    bank.start()
    rounds: list[dict] = []
    timeline: list[dict] = []
    all_ops = []
    report["rounds"] = rounds
    last_rev = _put_retrying(endpoints, f"{h.PREFIX}soak-start", "1", 60)
    deadline = None if cfg.time_limit_s is None else time.monotonic() + cfg.time_limit_s
    try:
        for r in range(cfg.rounds):
            if deadline is not None and time.monotonic() >= deadline:
                report["stopped_by_time_limit"] = f"after {r} of {cfg.rounds} rounds"
                break
            recorder = Recorder()
            round_start = time.monotonic()
            violations_before = len(bank.violations)
            register = Register(endpoints, recorder, cfg.seed + r, cfg.register_clients, keys=5)
            # keys of this round only: its history starts from absent keys, as the model does
            register.keys = [f"{h.PREFIX}reg/round-{r}/k{i}" for i in range(5)]
            prober = Prober(endpoints, recorder)
            nemesis.prober = prober
            register.start()
            prober.start()
            order = list(faults)
            rng.shuffle(order)
            records = []
            try:
                for fault in order:
                    try:
                        records.append(nemesis.run(fault))
                    except (AssertionError, RuntimeError) as exc:
                        problems.append(f"round {r} {fault}: {str(exc)[:500]}")
                        records.append({"fault": fault, "error": str(exc)[:2000]})
                        nemesis.heal_everything()
                    time.sleep(cfg.gap_s)
            finally:
                nemesis.heal_everything()
                register.stop()
                prober.stop()
            cluster.wait_healthy(cfg.healthy_timeout_s)
            register.final_reads(endpoints[0])
            end_rev = _put_retrying(endpoints, f"{h.PREFIX}round-{r}-end", "1", 60)
            bank_acked = [w for w in bank_recorder.acked_writes if last_rev < w[1] <= end_rev]
            bank_ops = [op for op in bank_recorder.ops if round_start <= op.start]
            rnd = _judge(
                cfg,
                r,
                cluster,
                recorder,
                register,
                bank,
                violations_before,
                records,
                (last_rev + 1, end_rev),
                bank_acked,
                bank_ops,
                problems,
            )
            rounds.append(rnd)
            last_rev = end_rev
            timeline += records
            all_ops += recorder.ops + bank_ops
            with bank_recorder._lock:  # bounded over a long soak: counted rounds go
                bank_recorder.ops = [
                    op for op in bank_recorder.ops if op.start >= time.monotonic() - 60
                ]
            print(json.dumps(_summary(rnd)), flush=True)
    finally:
        bank.stop()
    final_rev = _put_retrying(endpoints, f"{h.PREFIX}soak-end", "1", 60)
    rest = [w for w in bank_recorder.acked_writes if w[1] > last_rev]
    if rest and rounds:
        history = replay(endpoints[0], last_rev + 1, final_rev, timeout_s=120)
        lost = checks.lost_writes(rest, history)
        rounds[-1]["lost"] += len(lost)
        if lost:
            problems.append(f"after the last round: {len(lost)} bank writes lost: {lost[:3]}")
    problems += bank_recorder.problems
    report["timeline"] = timeline
    report["totals"] = {
        "rounds": len(rounds),
        "faults": sum(len(x["faults"]) for x in rounds),
        "acked_ops": sum(x["acked_ops"] for x in rounds),
        "lost": sum(x["lost"] for x in rounds),
        "linearizable_rounds": sum(x["linearizable"] == "OK" for x in rounds),
        "bank_reads": bank.reads,
        "bank_violations": len(bank.violations),
        "recovery_p50_s": checks.percentile(
            [f["recovery_s"] for f in timeline if f.get("recovery_s") is not None], 50
        ),
        "recovery_max_s": max(
            (f["recovery_s"] for f in timeline if f.get("recovery_s") is not None), default=None
        ),
    }
    try:
        from tests.chaos.plot import plot_timeline

        ops = sorted(all_ops, key=lambda o: o.start)
        series = {
            "t_s": [round(o.start - origin, 3) for o in ops],
            "latency_s": [round(o.end - o.start, 4) for o in ops],
            "outcome": [o.outcome for o in ops],
        }
        png = os.path.join(cfg.out_dir, "timeline.png")
        plot_timeline(
            {
                "timeline": timeline,
                "rounds": report["totals"]["faults"],
                "ops": {"total": len(ops)},
                "lost_writes": report["totals"]["lost"],
                "linearizability": {
                    "verdict": f"{report['totals']['linearizable_rounds']}/{len(rounds)} rounds OK"
                },
            },
            series,
            png,
        )
        report["png"] = png
    except ImportError as exc:
        report["png"] = f"not drawn: {exc}"


def _judge(
    cfg,
    r,
    cluster,
    recorder,
    register,
    bank,
    violations_before,
    records,
    revs,
    bank_acked,
    bank_ops,
    problems,
) -> dict:
    lost: list[str] = []
    try:
        history = replay(cluster.endpoints[0], revs[0], revs[1], timeout_s=120)
        lost = checks.lost_writes([*recorder.acked_writes, *bank_acked], history)
    except h.NoAnswer as exc:
        problems.append(f"round {r}: no history: {exc}")
    if lost:
        problems.append(f"round {r}: {len(lost)} acknowledged writes lost, e.g. {lost[:3]}")
    with open(os.path.join(cfg.out_dir, f"register-history-{r}.pickle"), "wb") as f:
        pickle.dump(register.history.operations(), f)  # for tests.lincheck offline
    result = check(KvModel(), register.history, timeout_s=cfg.check_timeout_s)
    if not result.ok:
        problems.append(f"round {r}: linearizability {result.verdict.name}")
        problems.append(f"round {r}: {result.explanation[:3000]}")
    bank_violations = len(bank.violations) - violations_before
    if bank_violations:
        problems.append(f"round {r}: {bank_violations} bank reads off the total")
    problems += [f"round {r}: {p}" for p in recorder.problems]
    recoveries = [x["recovery_s"] for x in records if x.get("recovery_s") is not None]
    return {
        "round": r,
        "faults": [f"{x['fault']}({','.join(x.get('targets', []))})" for x in records],
        "errors": [x["fault"] for x in records if "error" in x],
        "acked_ops": sum(1 for op in [*recorder.ops, *bank_ops] if op.outcome == "ok"),
        "acked_writes": len(recorder.acked_writes) + len(bank_acked),
        "lost": len(lost),
        "linearizable": result.verdict.name,
        "register_ops": result.operation_count,
        "bank_violations": bank_violations,
        "recovery_p50_s": checks.percentile(recoveries, 50),
        "recovery_max_s": max(recoveries, default=None),
        "slow_leader_moved": [
            x.get("leader_during") != x.get("leader_before")
            for x in records
            if x["fault"] == "slow-disk-leader" and "error" not in x
        ],
    }


def _summary(rnd: dict) -> dict:
    return {
        k: rnd[k]
        for k in (
            "round",
            "acked_ops",
            "lost",
            "linearizable",
            "bank_violations",
            "recovery_p50_s",
            "recovery_max_s",
            "errors",
        )
    }


def table(report: dict) -> str:
    rows = [
        "| round | faults | acked ops | lost | linearizable | bank violations | recovery p50 / max (s) |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    for x in report.get("rounds", []):
        rows.append(
            f"| {x['round']} | {len(x['faults'])} | {x['acked_ops']} | {x['lost']} | "
            f"{x['linearizable']} | {x['bank_violations']} | "
            f"{x['recovery_p50_s']} / {x['recovery_max_s']} |"
        )
    return "\n".join(rows)
