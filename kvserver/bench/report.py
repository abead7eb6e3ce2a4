"""Printing a benchmark's results the way etcd's ``benchmark`` tool does, plus a progress bar.

``format_report(result)`` gives the human text::

    Summary:
      Total:        2.0031 secs.
      Slowest:      0.0201 secs.
      Fastest:      0.0011 secs.
      Average:      0.0040 secs.
      Stddev:       0.0012 secs.
      Requests/sec: 998.4512

    Response time histogram:
      0.0011 [1]    |
      0.0030 [802]  |∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
      ...

    Latency distribution:
      10% in 0.0021 secs.
      ...
      99.9% in 0.0180 secs.

followed by ``Error distribution:`` (count and text per distinct error) when any request
failed, and one such block per request kind for ``mixed``. ``--json`` prints
``BenchResult.to_json()`` instead. ``ProgressBar`` draws on a terminal (stderr) only.
"""

from __future__ import annotations

import sys
import threading
import time

from kvserver.bench.result import BenchResult
from kvserver.bench.stats import Summary

BAR_WIDTH = 40


def format_summary(s: Summary) -> str:
    lines = ["Summary:", f"  Total:\t{s.total_s:.4f} secs."]
    if s.count:
        lines += [
            f"  Slowest:\t{s.slowest_s:.4f} secs.",
            f"  Fastest:\t{s.fastest_s:.4f} secs.",
            f"  Average:\t{s.average_s:.4f} secs.",
            f"  Stddev:\t{s.stddev_s:.4f} secs.",
        ]
    lines.append(f"  Requests/sec:\t{s.requests_per_s:.4f}")
    if s.count:
        lines += ["", "Response time histogram:"]
        peak = max(c for _, c in s.histogram) or 1
        for bound, count in s.histogram:
            bar = "∎" * (count * BAR_WIDTH // peak)
            lines.append(f"  {bound:.4f} [{count}]\t|{bar}")
        lines += ["", "Latency distribution:"]
        for p, v in s.percentiles.items():
            lines.append(f"  {p:g}% in {v:.4f} secs.")
    if s.error_counts:
        lines += ["", "Error distribution:"]
        for text, n in sorted(s.error_counts.items(), key=lambda kv: -kv[1]):
            lines.append(f"  [{n}]\t{text}")
    return "\n".join(lines)


def format_report(result: BenchResult) -> str:
    out = [format_summary(result.summary())]
    if len(result.by_kind) > 1:
        for kind, st in sorted(result.by_kind.items()):
            out.append(f"\n--- {kind} ({st.count} ok, {st.error_count} failed) ---")
            out.append(format_summary(st.summary()))
    return "\n".join(out) + "\n"


class ProgressBar:
    """``[=====>     ] 45%  1234 req  980 req/s`` redrawn on stderr every 0.2 s, TTY only.

    Reads the runner's per-process counters (``progress``); the goal is ``total`` requests,
    or ``duration_s`` seconds.
    """

    def __init__(self, progress, total: int | None, duration_s: float | None, stream=None) -> None:
        self.progress = progress
        self.total, self.duration_s = total, duration_s
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def __enter__(self) -> ProgressBar:
        self.t0 = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._draw(final=exc[0] is None)  # 100% only for a run that finished
            self.stream.write("\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._draw()

    def _draw(self, final: bool = False) -> None:
        done = sum(self.progress)
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        if self.total:
            frac = done / self.total
        elif self.duration_s:
            frac = elapsed / self.duration_s
        else:
            frac = 0.0
        frac = 1.0 if final else min(frac, 1.0)
        filled = int(frac * BAR_WIDTH)
        bar = "=" * filled + (">" if filled < BAR_WIDTH else "") + " " * (BAR_WIDTH - filled - 1)
        self.stream.write(
            f"\r[{bar[:BAR_WIDTH]}] {frac * 100:3.0f}%  {done} req  {done / elapsed:.0f} req/s "
        )
        self.stream.flush()
