"""Backups and the archive against a real S3 API: moto's server on 127.0.0.1 in a child
process, reached by s3fs through ``AWS_ENDPOINT_URL`` (slow: real raftkv processes)."""

from __future__ import annotations

import json

import pytest

from kvserver.client import Client
from tests.archive.helpers import cli, pitr_under_load, state_at
from tests.archive.moto_s3 import make_bucket, moto_server, s3_env

pytestmark = pytest.mark.slow


@pytest.fixture
def s3(tmp_path, monkeypatch):
    with moto_server(tmp_path) as endpoint:
        make_bucket(endpoint, "raftkv-backups")
        for k, v in s3_env(endpoint).items():
            monkeypatch.setenv(k, v)  # the members and the CLI inherit it
        yield endpoint


def test_snapshot_save_status_to_s3(make_cluster, s3):
    c = make_cluster(1)
    cl = Client(c.endpoints)
    for i in range(50):
        cl.put(f"s3/{i}", str(i))
    url = "s3://raftkv-backups/snaps/one.snap"
    r = cli("snapshot", "save", url, "--endpoints", c.endpoints[0], "--json")
    assert r.returncode == 0, r.stderr
    saved = json.loads(r.stdout)
    st = json.loads(cli("snapshot", "status", url, "--json").stdout)
    assert st == saved and st["keys"] == 50 == len(state_at(cl))


def test_pitr_through_s3(make_cluster, tmp_path, s3):
    pitr_under_load(make_cluster, tmp_path, "s3://raftkv-backups/archive")
