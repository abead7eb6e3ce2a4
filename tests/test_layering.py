"""Imports only point downward, between the top-level packages and between kvserver's layers.

- ``raft/``, ``raftpb/`` and ``bolt/`` use nothing of ours; ``wal/`` and ``snap/`` use only
  ``raftpb/``; ``kvserver/`` may use all five.
- Inside ``kvserver/`` every subpackage has a layer (``KVSERVER_LAYERS``, lowest first) and
  imports only from lower layers (or itself). The wire contract (``kvpb``) and ``tls`` are at
  the bottom; the client library sits right above them and may use nothing else, so a Spark
  worker or a script that imports the client loads no server code.
- The Spark package is client-side too, except the WAL data source and the changefeed's
  cold tier, which read a member's WAL files and archive on purpose
  (``SPARK_SERVER_DATA_READERS``).
- No import cycle between our modules, however the import is written (at the top of a module
  or inside a function): the source is read with ``ast`` so a lazy import counts too.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"raft", "raftpb", "wal", "snap", "bolt", "kvserver", "tests"}
ALLOWED = {
    "raft": set(),
    "raftpb": set(),
    "wal": {"raftpb"},
    "snap": {"raftpb"},
    "bolt": set(),  # bolt's file format: pure
    "kvserver": {"raft", "raftpb", "wal", "snap", "bolt"},
}

# kvserver's layers, lowest first; a layer may import the layers before it.
KVSERVER_LAYERS: list[set[str]] = [
    # the wire contracts (ours, etcd's gRPC API); TLS contexts; stage marks for timing; which
    # form of the compiled modules runs (imported by kvserver/__init__.py, before them all)
    {"kvpb", "etcdpb", "tls", "stages", "native"},
    {"client"},  # the client library: kvpb and tls only (CLIENT_SIDE below)
    {"mvcc", "auth", "rafthttp"},  # the store, auth state, raft messages between peers
    {"watch", "lease"},  # subsystems over the store
    {"membership"},  # identity, the member registry, the member service
    {"server"},  # raft driver, its storage, the replicated KV service, config, metrics
    {"archive", "etcdsnap"},  # backups, the archive, PITR; etcd's snapshot files
    {"api"},  # the client-facing dialects over the service
    {"assembly"},  # builds and runs one member
    {"localcluster"},  # cluster up: members as processes
    {"spark", "bench"},  # clients of the cluster (Spark, load generators)
    {"cli"},  # the raftkv command
]
# Packages whose modules may import only these layers of kvserver (plus themselves).
CLIENT_SIDE = {
    "client": {"kvpb", "tls"},
    "spark": {"client", "kvpb", "tls"},
}
SPARK_SERVER_DATA_READERS = {
    "kvserver.spark.wal_rows",
    "kvserver.spark.wal_source",
    "kvserver.spark.source.cold_history",  # the changefeed's replay of the archive
}
SPARK_DEMO = {"kvserver.spark.demo"}  # starts a local cluster when given none


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Our modules ``path`` imports anywhere in it. ``from P import name`` counts as an import
    of ``P.name`` when that is a module of ours, else of ``P``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + [node.module])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m.split(".")[0] in OURS}


def our_modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


ALL_MODULES = {
    name: path for package in sorted(ALLOWED) for name, path in our_modules(package).items()
}


def kvserver_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "kvserver" and len(parts) > 1 else None


def layer_of(package: str) -> int:
    for rank, layer in enumerate(KVSERVER_LAYERS):
        if package in layer:
            return rank
    raise AssertionError(f"kvserver/{package} has no layer in KVSERVER_LAYERS")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_downward(package):
    bad = []
    for name, path in our_modules(package).items():
        ours = {m.split(".")[0] for m in imported_modules(path, set(ALL_MODULES))} - {package}
        if ours - ALLOWED[package]:
            bad.append(f"{name} imports {sorted(ours - ALLOWED[package])}")
    assert not bad, "\n".join(bad)


def test_every_kvserver_package_has_a_layer():
    packages = {p.name for p in (ROOT / "kvserver").iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "kvserver").glob("*.py") if p.stem != "__init__"}
    for package in sorted(packages | modules):
        layer_of(package)


def test_kvserver_layers_import_only_downward():
    bad = []
    for name, path in ALL_MODULES.items():
        mine = kvserver_package(name)
        if mine is None:
            continue
        for target in sorted(imported_modules(path, set(ALL_MODULES))):
            theirs = kvserver_package(target)
            if theirs is None or theirs == mine:
                continue
            if layer_of(theirs) > layer_of(mine):
                bad.append(f"{name} ({mine}) imports {target} ({theirs}, a higher layer)")
            elif mine in CLIENT_SIDE and theirs not in CLIENT_SIDE[mine]:
                if name in SPARK_SERVER_DATA_READERS:
                    continue
                if name in SPARK_DEMO and theirs == "localcluster":
                    continue
                bad.append(f"{name} is client-side and imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    known = set(ALL_MODULES)
    graph = {name: imported_modules(path, known) & known for name, path in ALL_MODULES.items()}
    # Tarjan's strongly connected components, iteratively (the graph has ~400 nodes).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_test_module_imports_another():
    """Shared test code lives in helper modules (tests/support/, a directory's helpers), so
    running one test module never collects or depends on another."""
    tests = our_modules("tests")
    bad = []
    for name, path in tests.items():
        if not path.name.startswith("test_"):
            continue
        for target in sorted(imported_modules(path, set(tests))):
            if target.rsplit(".", 1)[-1].startswith("test_") and target != name:
                bad.append(f"{name} imports {target}")
    assert not bad, "\n".join(bad)


# The client dialects beside each other: neither imports the other; what both use lives in
# kvserver/api/shared, below them.
API_DIALECTS = ("kvserver.api.grpc", "kvserver.api.http")


def test_the_client_dialects_do_not_import_each_other():
    bad = []
    for name, path in ALL_MODULES.items():
        mine = next((d for d in API_DIALECTS if name == d or name.startswith(d + ".")), None)
        if mine is None:
            continue
        for target in sorted(imported_modules(path, set(ALL_MODULES))):
            for other in API_DIALECTS:
                if other != mine and (target == other or target.startswith(other + ".")):
                    bad.append(f"{name} imports {target}")
    shared = {n: p for n, p in ALL_MODULES.items() if n.startswith("kvserver.api.shared")}
    for name, path in shared.items():
        for target in sorted(imported_modules(path, set(ALL_MODULES))):
            if target.startswith(API_DIALECTS):
                bad.append(f"{name} (shared) imports {target}")
    assert not bad, "\n".join(bad)
