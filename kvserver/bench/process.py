"""One ``raftkv bench`` run as a separate process, as an operator runs it (for the scripts that
compare settings side by side: ``tls_compare``, ``auth_compare``, ``benchmarks/security_cost``).

``bench_process(endpoints, workload, clients, duration_s, ca_file=, user=)`` returns the
``--json`` result; a failed run raises ``SystemExit`` with the end of its stderr. The child
gets no ``RAFTKV_*`` variables, so a developer's environment cannot change what is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence


def bench_process(endpoints: Sequence[str], workload: Sequence[str], clients: int,
                  duration_s: float, *, ca_file: str | None = None,
                  user: str | None = None, what: str = "bench") -> dict:
    args = [sys.executable, "-m", "kvserver.cli", "bench", *workload, "--clients", str(clients),
            "--duration", str(duration_s), "--json", "--endpoints", ",".join(endpoints)]
    if ca_file:
        args += ["--cacert", ca_file]
    if user:
        args += ["--user", user]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTKV_")}
    run = subprocess.run(args, capture_output=True, text=True, timeout=duration_s + 120,
                         env=env)
    if run.returncode != 0:
        raise SystemExit(f"{what} failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout)
