"""The gRPC server's HTTP/2 path, compiled to C by mypyc, and when the compiled form is used.

Why: a client front end spends most of a call's CPU parsing HTTP/2 frames and header blocks
and writing answers, all of it plain Python. mypyc compiles these type-annotated modules
unchanged into extension modules that run them about twice as fast
(``benchmarks/grpc_call_cost.py``). They stay ordinary Python: with no compiler, or built
nowhere (an image installed from a wheel), the sources run as before.

Contract:

- ``build()`` (run by ``make``) compiles ``NATIVE_MODULES`` into
  extension modules beside their sources, and records each source's hash in
  ``.build/native.json``. It needs mypy, setuptools and a C compiler.
- ``install()`` (called by ``kvserver/__init__.py``, so before any of them is imported)
  decides which form runs. Python prefers an extension module to a source file of the same
  name, so a compiled module would hide every edit made to its source since the build. When
  any listed source differs from the one compiled, or a compiled file is missing, every
  listed module runs from source, with one warning that says to run ``make``: all or none,
  since compiled modules call each other directly, not through their Python names.
  ``RAFTKV_NATIVE=0`` runs them from source too (to compare the two, or to debug).
- ``compiled()`` says whether the listed modules run compiled in this process.

Compiled code checks the annotations it relies on (an ``int`` parameter given a ``str``
raises ``TypeError``) and its classes cannot be patched at run time; the test suite runs
the compiled form wherever ``make`` built it, and CI always builds it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

# One job each: frames and header blocks (h2, hpack_decoder), the connection's state machine
# and its events (h2_machine, h2_events, budgets), the asyncio protocol that serves calls on
# it (connection, stream, rpc, metrics), and the front end's link messages (frontend_wire).
NATIVE_MODULES = (
    "kvserver.api.grpc.budgets",
    "kvserver.api.grpc.connection",
    "kvserver.api.grpc.frontend_wire",
    "kvserver.api.grpc.h2",
    "kvserver.api.grpc.h2_events",
    "kvserver.api.grpc.h2_machine",
    "kvserver.api.grpc.hpack_decoder",
    "kvserver.api.grpc.metrics",
    "kvserver.api.grpc.rpc",
    "kvserver.api.grpc.stream",
)
# The compiled modules share one library of mypyc's, named after this group.
GROUP = "kvserver_native"
ENV = "RAFTKV_NATIVE"
ROOT = Path(__file__).resolve().parent.parent


def manifest_path(root: Path) -> Path:
    """Where a build records the hashes of the sources it compiled."""
    return root / ".build" / "native.json"


MANIFEST = manifest_path(ROOT)


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def is_compiled(module: str, root: Path = ROOT) -> bool:
    """Whether an extension module this interpreter can import sits beside the source."""
    source = source_path(module, root)
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return any(source.with_name(source.stem + suffix).exists() for suffix in suffixes)


def source_hashes(modules: Sequence[str], root: Path = ROOT) -> dict[str, str]:
    return {m: hashlib.sha256(source_path(m, root).read_bytes()).hexdigest() for m in modules}


def choose(modules: Sequence[str], root: Path, manifest: Path, env: str | None) -> str:
    """``"compiled"``; ``"source"`` (nothing compiled here); ``"off"`` (compiled, but
    ``RAFTKV_NATIVE=0``); or ``"stale"`` (compiled, but not from today's sources, or only in
    part)."""
    present = [m for m in modules if is_compiled(m, root)]
    if not present:
        return "source"
    if env == "0":
        return "off"
    if len(present) < len(modules):
        return "stale"
    try:
        recorded = json.loads(manifest.read_text())["sources"]
    except (OSError, ValueError, KeyError):
        return "stale"
    return "compiled" if recorded == source_hashes(modules, root) else "stale"


class SourceFirst:
    """A meta-path finder that imports the listed modules from their ``.py`` files."""

    def __init__(self, modules: Sequence[str], root: Path) -> None:
        self.paths = {m: source_path(m, root) for m in modules}

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.paths.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


_state = "source"


def install(
    modules: Sequence[str] = NATIVE_MODULES, root: Path = ROOT, manifest: Path = MANIFEST
) -> str:
    """Make the listed modules import in one form, all of them; return which."""
    global _state
    _state = choose(modules, root, manifest, os.environ.get(ENV))
    if _state in ("stale", "off"):
        sys.meta_path.insert(0, SourceFirst(modules, root))
    if _state == "stale":
        log.warning(
            "raftkv: the compiled HTTP/2 modules are older than their sources; running "
            "them from source (slower). `make` compiles them again."
        )
    return _state


def compiled() -> bool:
    return _state == "compiled"


def build(modules: Sequence[str] = NATIVE_MODULES, root: Path = ROOT) -> None:
    """Compile ``modules`` with mypyc into extension modules beside their sources."""
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]

    build_dir = root / ".build" / "native"
    build_dir.mkdir(parents=True, exist_ok=True)
    manifest = manifest_path(root)
    manifest.unlink(missing_ok=True)  # until this build has ended, what is here is stale
    hashes = source_hashes(modules, root)
    os.chdir(root)
    # mypy's own settings for the project (pyproject.toml) make checks, not code: compile
    # with its defaults, so a note about an unused section does not stop the build.
    config = build_dir / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\n")
    paths = [str(source_path(m, root).relative_to(root)) for m in modules]
    setup(
        name=GROUP,
        ext_modules=mypycify(
            [f"--config-file={config}", *paths],
            opt_level="3",
            group_name=GROUP,
            target_dir=str(build_dir / "c"),
        ),
        script_args=["-q", "build_ext", "--inplace", "--build-temp", str(build_dir / "tmp")],
    )
    manifest.write_text(json.dumps({"sources": hashes}, indent=1))
