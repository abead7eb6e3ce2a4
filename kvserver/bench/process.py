"""One ``raftkv bench`` run as a separate process, as an operator runs it (for the scripts that
compare settings side by side: ``tls_compare``, ``auth_compare``, ``benchmarks/security_cost``).

``bench_process(endpoints, workload, clients, duration_s, ca_file=, user=)`` returns the
``--json`` result; a failed run raises ``SystemExit`` with the end of its stderr.
``wait_writable(endpoints)`` returns once the cluster acknowledges a put (bounded). The child
gets no ``RAFTKV_*`` variables, so a developer's environment cannot change what is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from kvserver.client import Client


def bench_process(
    endpoints: Sequence[str],
    workload: Sequence[str],
    clients: int,
    duration_s: float,
    *,
    ca_file: str | None = None,
    user: str | None = None,
    what: str = "bench",
) -> dict:
    args = [
        sys.executable,
        "-m",
        "kvserver.cli",
        "bench",
        *workload,
        "--clients",
        str(clients),
        "--duration",
        str(duration_s),
        "--json",
        "--endpoints",
        ",".join(endpoints),
    ]
    if ca_file:
        args += ["--cacert", ca_file]
    if user:
        args += ["--user", user]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTKV_")}
    run = subprocess.run(args, capture_output=True, text=True, timeout=duration_s + 120, env=env)
    if run.returncode != 0:
        raise SystemExit(f"{what} failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout)


def wait_writable(
    endpoints: Sequence[str],
    *,
    ca_file: str | None = None,
    timeout_s: float = 90.0,
    what: str = "the cluster",
) -> None:
    """Return once a put is acknowledged; ``SystemExit`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with Client(list(endpoints), ca_file=ca_file, timeout_s=5) as c:
        while True:
            try:
                c.put("bench/ready", "1")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{what} not ready") from None
                time.sleep(0.2)
