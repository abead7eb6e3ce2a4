"""Sync policies: when an append is made durable (fdatasync) before it is acknowledged.

* ``always`` (default): every save that must be durable (entries, a term or vote change, a
  snapshot record) is fdatasync'ed before it returns / its future resolves. Concurrent
  appends share fsyncs (group commit), so this costs one fsync per batch, not per save.
* ``interval=<ms>``: saves return once written to the OS; a background thread fdatasyncs at
  most ``ms`` milliseconds after the first unsynced write. A machine crash (not a process
  crash) can lose up to that window of acknowledged writes: documented, bounded loss.
* ``never``: no data fsync at all, for tests and benchmarks. It must be spelled out; no
  alias ("off", "none", "0", ...) and no empty value selects it.

Structural steps (create, cut, rename) are fsynced under every policy, so the file layout is
always consistent even where the data is not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAX_INTERVAL_MS = 60_000


class SyncMode(enum.Enum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class SyncPolicy:
    mode: SyncMode = SyncMode.ALWAYS
    interval_ms: int = 0  # invariant: 1 <= interval_ms <= MAX_INTERVAL_MS iff mode is INTERVAL

    def __post_init__(self) -> None:
        if self.mode is SyncMode.INTERVAL:
            if not 1 <= self.interval_ms <= MAX_INTERVAL_MS:
                raise ValueError(
                    f"sync interval must be 1..{MAX_INTERVAL_MS} ms, got {self.interval_ms}"
                )
        elif self.interval_ms:
            raise ValueError(f"interval_ms only applies to the interval policy ({self.mode})")

    @classmethod
    def parse(cls, value: str | SyncPolicy) -> SyncPolicy:
        if isinstance(value, SyncPolicy):
            return value
        if not isinstance(value, str):
            raise TypeError(f"sync policy must be a string or SyncPolicy, got {value!r}")
        text = value.strip()
        if text == "always":
            return cls(SyncMode.ALWAYS)
        if text == "never":
            return cls(SyncMode.NEVER)
        if text.startswith("interval="):
            raw = text[len("interval=") :].removesuffix("ms")
            if raw.isdigit():
                return cls(SyncMode.INTERVAL, int(raw))
        raise ValueError(f"unknown sync policy {value!r}: use 'always', 'interval=<ms>' or 'never'")

    def __str__(self) -> str:
        if self.mode is SyncMode.INTERVAL:
            return f"interval={self.interval_ms}"
        return str(self.mode.value)  # str already; mypy types a narrowed member's value Any
