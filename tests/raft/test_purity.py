"""raft/ is a pure state machine. No module imports os, socket, asyncio,
threading, time, subprocess or select (not even lazily inside a function), and nothing calls
the module-level ``random`` functions: randomness only comes from ``Config.rng``."""

import ast
from pathlib import Path

import pytest

RAFT = Path(__file__).resolve().parents[2] / "raft"
FORBIDDEN_MODULES = {"os", "socket", "asyncio", "threading", "time", "subprocess", "select"}
RANDOM_ALLOWED = {"Random"}  # the class (seeded instance), never the shared global generator


def sources():
    files = sorted(RAFT.rglob("*.py"))
    assert len(files) >= 10, "raft/ modules not found"
    return files


def violations(tree: ast.AST) -> list[str]:
    bad = []
    random_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in FORBIDDEN_MODULES:
                    bad.append(f"line {node.lineno}: import {alias.name}")
                if root == "random":
                    random_aliases.add(alias.asname or "random")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if root in FORBIDDEN_MODULES:
                bad.append(f"line {node.lineno}: from {node.module} import ...")
            if root == "random":
                for alias in node.names:
                    if alias.name not in RANDOM_ALLOWED:
                        bad.append(f"line {node.lineno}: from random import {alias.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("__import__", "exec", "eval"):
                bad.append(f"line {node.lineno}: {node.func.id}()")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in random_aliases
            and node.attr not in RANDOM_ALLOWED
        ):
            bad.append(f"line {node.lineno}: random.{node.attr}")
    return bad


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.name)
def test_raft_module_does_no_io_and_uses_no_global_random(path):
    bad = violations(ast.parse(path.read_text(), filename=str(path)))
    assert not bad, f"{path.name}: " + "; ".join(bad)


@pytest.mark.parametrize(
    "src",
    [
        "import os",
        "import time as t",
        "from socket import socket",
        "def f():\n    import threading",
        "import random\nx = random.random()",
        "import random as r\nr.shuffle([])",
        "from random import choice",
        "__import__('os')",
        "import select",
        "import subprocess",
        "import asyncio.events",
    ],
)
def test_the_scanner_catches_each_kind_of_violation(src):
    assert violations(ast.parse(src))


def test_the_scanner_allows_a_seeded_random_instance():
    assert violations(ast.parse("import random\nrng = random.Random(1)\nrng.random()")) == []
