"""``raftkv wal dump|verify|repair`` (placeholder until the WAL lands)."""


def register(sub) -> None:
    p = sub.add_parser("wal", help="inspect, verify and repair a write-ahead log")
    p.set_defaults(func=lambda args: print("wal tools: not built yet") or 2)
