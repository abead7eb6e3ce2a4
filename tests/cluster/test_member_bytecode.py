"""A local cluster writes its members' bytecode before starting them, so a member start reads
it instead of compiling every module again (see kvserver/localcluster/bytecode.py)."""

import importlib.util
import os
import sys

from kvserver.localcluster.bytecode import compile_member_packages


def test_bytecode_is_written_for_every_module_and_refreshed_when_the_source_changes(tmp_path):
    pkg = tmp_path / "rkv_bytecode_probe"
    (pkg / "sub").mkdir(parents=True)
    sources = [pkg / "__init__.py", pkg / "mod.py", pkg / "sub" / "__init__.py"]
    for i, src in enumerate(sources):
        src.write_text(f"VALUE = {i}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        compile_member_packages(("rkv_bytecode_probe", "rkv_no_such_package"))
        cached = [importlib.util.cache_from_source(str(src)) for src in sources]
        assert all(os.path.exists(c) for c in cached)
        before = os.stat(cached[1]).st_mtime_ns
        compile_member_packages(("rkv_bytecode_probe",))  # nothing changed: left alone
        assert os.stat(cached[1]).st_mtime_ns == before
        sources[1].write_text("VALUE = 'changed, and longer'\n")
        os.utime(sources[1], ns=(before + 10**9, before + 10**9))
        compile_member_packages(("rkv_bytecode_probe",))
        assert os.stat(cached[1]).st_mtime_ns != before
    finally:
        sys.path.remove(str(tmp_path))
