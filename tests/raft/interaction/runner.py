"""Run trace files: one fresh InteractionEnv per file. Also a small command-line tool.

    python -m tests.raft.interaction.runner [--rewrite] [NAME_OR_PATH...]

runs (or rewrites) the named traces (default: every file in testdata/) and prints one line
per file; the exit status is 1 if any trace failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests.raft.interaction.commands import execute
from tests.raft.interaction.datadriven import run_file
from tests.raft.interaction.env import InteractionEnv

TESTDATA = Path(__file__).resolve().parent / "testdata"
REWRITE_ENV_VAR = "RAFT_TRACES_REWRITE"


def trace_files() -> list[Path]:
    return sorted(TESTDATA.glob("*.txt"))


def rewrite_requested_by_env() -> bool:
    return os.environ.get(REWRITE_ENV_VAR, "") not in ("", "0")


def run_trace(path: Path, rewrite: bool = False) -> int:
    """Run one trace file; return the number of blocks. Raises on a mismatch."""
    env = InteractionEnv()
    return run_file(path, lambda cmd: execute(env, cmd), rewrite=rewrite)


def _resolve(name: str) -> Path:
    p = Path(name)
    if p.exists():
        return p
    p = TESTDATA / (name if name.endswith(".txt") else name + ".txt")
    if not p.exists():
        raise SystemExit(f"no trace {name!r}")
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rewrite", action="store_true", help="rewrite expectations in place")
    ap.add_argument("traces", nargs="*", help="file names in testdata/ or paths")
    args = ap.parse_args(argv)
    paths = [_resolve(t) for t in args.traces] or trace_files()
    failed = 0
    for p in paths:
        try:
            n = run_trace(p, rewrite=args.rewrite)
        except Exception as e:  # report every file, then fail
            failed += 1
            print(f"FAIL {p.name}: {type(e).__name__}: {e}")
        else:
            print(f"ok   {p.name} ({n} blocks)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
