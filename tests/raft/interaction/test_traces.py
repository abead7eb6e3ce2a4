"""Every trace file in testdata/ as one test.

A trace pins down the exact messages, Readies and state changes of a scenario; see the
comments at the top of each file for the Raft behaviour it shows.
"""

from pathlib import Path

import pytest

from tests.raft.interaction.runner import run_trace, trace_files

TRACES = trace_files()


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_trace(path: Path, rewrite_traces: bool) -> None:
    assert run_trace(path, rewrite=rewrite_traces) > 0


def test_every_trace_starts_with_comments_saying_what_it_shows() -> None:
    for path in TRACES:
        lines = path.read_text(encoding="utf-8").splitlines()
        head = []
        for line in lines:
            if not line.startswith("#"):
                break
            head.append(line.lstrip("# ").strip())
        assert len(" ".join(head)) >= 40, f"{path.name} must start with a comment header"
