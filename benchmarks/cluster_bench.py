"""Kept for old commands: raftkv vs etcd only; now a thin wrapper around compare.py.

    .venv/bin/python benchmarks/cluster_bench.py                 # = compare.py --systems raftkv,etcd
    .venv/bin/python benchmarks/cluster_bench.py --clients 64 --ops put,get --duration 10

``--clients`` and ``--ops put,get`` map to compare.py's ``--put-clients``/``--range-clients``;
every other flag is passed through (see ``benchmarks/compare.py --help``).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.compare import main as compare_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--ops", default="put,get")
    args, rest = ap.parse_known_args(argv)
    ops = set(args.ops.split(","))
    return compare_main(
        [
            "--systems",
            args.systems,
            "--put-clients",
            args.clients if "put" in ops else "",
            "--range-clients",
            args.clients if "get" in ops else "",
            *rest,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
