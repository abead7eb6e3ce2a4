"""The columnar client loads pyarrow and numpy on first use only, and no server code.

``kvserver.client`` (which every Spark worker and script imports) and
``kvserver.client.columnar`` itself must not pay for pyarrow/numpy until an Arrow answer is
decoded, nor load the raft core or the server. Each check runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pyarrow", "numpy", "raft", "raftpb", "wal", "snap", "kvserver.server", "kvserver.mvcc")


def loaded_after(code: str) -> list[str]:
    program = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("module", ["kvserver.client", "kvserver.client.columnar"])
def test_importing_the_client_loads_no_arrow_and_no_server(module: str) -> None:
    assert heavy_in(loaded_after(f"import {module}")) == []


def test_decoding_an_answer_loads_arrow_but_still_no_server() -> None:
    pytest.importorskip("pyarrow")
    code = (
        "from kvserver.client import columnar\n"
        'columnar.decode_range_arrow(b\'{"header":{"revision":"3"},"kvs":[{"key":"YQ=="}]}\')'
    )
    loaded = loaded_after(code)
    assert "pyarrow" in loaded
    assert [m for m in heavy_in(loaded) if not m.startswith(("pyarrow", "numpy"))] == []
