"""Fixtures for the WAL tests."""

import os
import shutil
import tempfile

import pytest


@pytest.fixture
def ram_path(tmp_path):
    """A directory on tmpfs when there is one: for tests that exercise parsing and repair
    hundreds of times and do not measure durability, fsync there costs nothing."""
    yield from _ram_dir(tmp_path)


@pytest.fixture(scope="module")
def ram_path_module(tmp_path_factory):
    yield from _ram_dir(tmp_path_factory.mktemp("wal"))


def _ram_dir(fallback):
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        path = tempfile.mkdtemp(prefix="raftkv-wal-test-", dir=shm)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    else:
        yield str(fallback)
