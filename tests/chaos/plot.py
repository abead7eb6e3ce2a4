"""The PNG timeline of a chaos run (matplotlib, no display needed).

Top: every operation's latency (log scale) at the time it was invoked, acknowledged ones in
blue, unknown outcomes (timeouts, refused) in red, definite failures (a compare that did not
hold, a lock already held) in grey. Bottom: operations with an unknown outcome per second.
Faults are shaded bands from injection to heal, one colour per family, labelled with the fault
and its target; a dotted line marks when the cluster was healthy again.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {
    "kill": "tab:red",
    "pause": "tab:orange",
    "restart": "tab:purple",
    "partition": "tab:green",
}


def plot_timeline(report: dict, series: dict, path: str) -> None:
    t, lat, outcome = series["t_s"], series["latency_s"], series["outcome"]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(14, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for kind, colour, label in (
        ("ok", "tab:blue", "acknowledged"),
        ("unknown", "tab:red", "unknown outcome"),
        ("fail", "0.5", "definite failure"),
    ):
        xs = [x for x, o in zip(t, outcome, strict=True) if o == kind]
        ys = [max(y, 1e-4) for y, o in zip(lat, outcome, strict=True) if o == kind]
        top.scatter(xs, ys, s=3, c=colour, label=f"{label} ({len(xs)})", alpha=0.6, linewidths=0)
    top.set_yscale("log")
    top.set_ylabel("latency (s)")
    end = max(t, default=1.0)
    bins = int(end) + 1
    errors = [0] * bins
    for x, o in zip(t, outcome, strict=True):
        if o == "unknown" and 0 <= x < bins:
            errors[int(x)] += 1
    bottom.bar(range(bins), errors, width=1.0, align="edge", color="tab:red")
    bottom.set_ylabel("unknown / s")
    bottom.set_xlabel("seconds since the workloads started")
    for fault in report.get("timeline", []):
        start, heal = fault.get("start_s"), fault.get("heal_s")
        if start is None:
            continue
        heal = heal if heal is not None else start + 1
        colour = COLOURS.get(fault["fault"].split("-")[0], "0.7")
        for ax in (top, bottom):
            ax.axvspan(start, heal, color=colour, alpha=0.18, linewidth=0)
            if fault.get("healthy_s") is not None:
                ax.axvline(fault["healthy_s"], color=colour, linestyle=":", linewidth=0.8)
        targets = ",".join(fault.get("targets", []))
        top.text(
            start,
            1.02,
            f"{fault['fault']} {targets}",
            rotation=60,
            fontsize=6,
            transform=top.get_xaxis_transform(),
            va="bottom",
        )
    lin = report.get("linearizability", {}).get("verdict", "?")
    fo = report.get("failover")  # (the soak measures recovery per fault instead)
    failover = (
        f", leader-kill failover p50 {fo.get('p50_s')} s p99 {fo.get('p99_s')} s" if fo else ""
    )
    fig.suptitle(
        f"raftkv chaos: {report.get('rounds', 0)} faults, "
        f"{report.get('ops', {}).get('total', 0)} ops, "
        f"acknowledged writes lost {report.get('lost_writes', '?')}, "
        f"linearizability {lin}{failover}",
        fontsize=9,
    )
    top.legend(loc="upper right", fontsize=7, markerscale=3)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
