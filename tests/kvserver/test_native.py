"""The compiled HTTP/2 modules: which form runs, and that a stale build never hides an edit.

The choice is tested on a small package made in ``tmp_path`` (its "extension modules" are
files that would fail to load), so these tests need no compiler. The last tests check the
checkout itself: CI builds the compiled form (``make``), so there the suite must be running it.
"""

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys

import pytest

from kvserver import native
from tests.conftest import external_required

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
MODULES = ("pkg_native_t.a", "pkg_native_t.b")


def _tree(tmp_path, compiled=("a", "b"), record=True):
    pkg = tmp_path / "pkg_native_t"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("WHERE = 'source a'\n")
    (pkg / "b.py").write_text("WHERE = 'source b'\n")
    for name in compiled:
        # not a loadable library: importing it instead of the source fails loudly
        (pkg / f"{name}{SUFFIX}").write_bytes(b"not an ELF file")
    manifest = tmp_path / "native.json"
    if record:
        manifest.write_text(json.dumps({"sources": native.source_hashes(MODULES, tmp_path)}))
    return pkg, manifest


def test_nothing_compiled_is_source(tmp_path):
    _, manifest = _tree(tmp_path, compiled=(), record=False)
    assert native.choose(MODULES, tmp_path, manifest, None) == "source"


def test_built_from_todays_sources_is_compiled(tmp_path):
    _, manifest = _tree(tmp_path)
    assert native.choose(MODULES, tmp_path, manifest, None) == "compiled"
    assert native.choose(MODULES, tmp_path, manifest, "1") == "compiled"


def test_an_edited_source_makes_the_build_stale(tmp_path):
    pkg, manifest = _tree(tmp_path)
    (pkg / "b.py").write_text("WHERE = 'edited b'\n")
    assert native.choose(MODULES, tmp_path, manifest, None) == "stale"


def test_a_missing_extension_or_record_makes_the_build_stale(tmp_path):
    _, manifest = _tree(tmp_path, compiled=("a",))
    assert native.choose(MODULES, tmp_path, manifest, None) == "stale"
    manifest.unlink()
    assert native.choose(MODULES, tmp_path, manifest, None) == "stale"


def test_turned_off_by_the_environment(tmp_path):
    _, manifest = _tree(tmp_path)
    assert native.choose(MODULES, tmp_path, manifest, "0") == "off"


def test_stale_modules_import_from_source_all_of_them(tmp_path, monkeypatch, caplog):
    pkg, manifest = _tree(tmp_path)
    (pkg / "a.py").write_text("WHERE = 'edited a'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in ("pkg_native_t", *MODULES):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError):  # without the guard, the "extension" wins and fails
        importlib.import_module("pkg_native_t.b")
    monkeypatch.delitem(sys.modules, "pkg_native_t.b", raising=False)
    monkeypatch.setattr(native, "_state", native._state)
    assert native.install(MODULES, tmp_path, manifest) == "stale"
    assert "older than their sources" in caplog.text
    assert importlib.import_module("pkg_native_t.a").WHERE == "edited a"
    assert importlib.import_module("pkg_native_t.b").WHERE == "source b"  # unedited, yet source
    assert not native.compiled()


def _checkout_state(env_value):
    env = {**os.environ, native.ENV: env_value}
    code = "import kvserver.native as n, kvserver.api.grpc.h2 as m; print(n._state, m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_this_checkout_runs_the_compiled_modules_when_built():
    state = native.choose(native.NATIVE_MODULES, native.ROOT, native.MANIFEST, None)
    if state != "compiled":
        if external_required():
            pytest.fail(f"`make` should have compiled the HTTP/2 modules here: {state}")
        pytest.skip(f"the HTTP/2 modules are not compiled here ({state}): run `make native`")
    assert native.compiled()
    for name in native.NATIVE_MODULES:
        assert importlib.import_module(name).__file__.endswith(SUFFIX), name
    state, path = _checkout_state("1")
    assert (state, path.endswith(SUFFIX)) == ("compiled", True)
    state, path = _checkout_state("0")
    assert (state, path.endswith(".py")) == ("off", True)
