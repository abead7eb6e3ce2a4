"""DESIGN §1: imports only point downward.

raft/ and raftpb/ use nothing of ours; wal/ and snap/ use only raftpb/; kvserver/ may use
everything. Checked on the source with ast so that a lazy import inside a function counts too.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"raft", "raftpb", "wal", "snap", "kvserver", "tests"}
ALLOWED = {
    "raft": set(),
    "raftpb": set(),
    "wal": {"raftpb"},
    "snap": {"raftpb"},
    "kvserver": {"raft", "raftpb", "wal", "snap"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_downward(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        ours = (imported_packages(path) & OURS) - {package}
        if ours - ALLOWED[package]:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(ours - ALLOWED[package])}")
    assert not bad, "\n".join(bad)
