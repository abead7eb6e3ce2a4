"""``raftkv bench --protocol grpc``: the same workloads as etcd's KV gRPC calls, against an
in-process raftkv cluster and a real etcd, through the same stubs. Counts, never timings."""

import pytest

from kvserver.bench.result import find_leader
from kvserver.bench.runner import run
from kvserver.bench.workloads import BenchOptions
from tests.etcd_process import etcd_process
from tests.support.bench_cli import bench_json, put_200_through_the_cli


def test_grpc_puts_through_the_cli_are_counted_and_applied_once(capsys, inproc_cluster):
    doc = put_200_through_the_cli(capsys, inproc_cluster, protocol="grpc")
    assert doc["options"]["protocol"] == "grpc"


def test_every_grpc_workload_counts_its_calls(inproc_cluster):
    eps = inproc_cluster.endpoints
    cases = [
        dict(op="range", consistency="l"),
        dict(op="range", consistency="s"),
        dict(op="txn-put", txn_ops=3, key_space_size=10),
        dict(op="mixed", read_ratio=0.5, key_space_size=10),
        dict(op="put", sequential_keys=True, key_space_size=7, conns=1),
    ]
    for case in cases:
        opts = BenchOptions(
            **{"endpoints": eps, "clients": 4, "total": 60, "protocol": "grpc", **case}
        ).validate()
        r = run(opts)
        assert (r.stats.count, r.stats.error_count) == (60, 0), (case, r.stats.errors)
    leader = find_leader(eps)
    before = inproc_cluster.revision()
    r = run(
        BenchOptions(
            op="txn-put",
            endpoints=eps,
            clients=2,
            total=10,
            txn_ops=3,
            key_space_size=10,
            target_leader=True,
            protocol="grpc",
        ).validate()
    )
    assert r.endpoints_used == [leader]
    assert (r.stats.count, r.stats.error_count) == (10, 0)
    assert inproc_cluster.revision() == before + 10  # one revision per txn


def test_grpc_errors_are_counted_by_status(inproc_cluster):
    """A put larger than --max-request-bytes: every call fails with etcd's status and text,
    counted in the error distribution as HTTP errors are."""
    r = run(
        BenchOptions(
            op="put",
            endpoints=inproc_cluster.endpoints,
            clients=2,
            total=6,
            val_size=1792 * 1024,  # over 1.5 MiB, under gRPC's own message limit
            protocol="grpc",
        ).validate()
    )
    assert r.stats.count == 0
    assert dict(r.stats.errors) == {"gRPC INVALID_ARGUMENT: etcdserver: request is too large": 6}


@pytest.mark.external
def test_the_same_grpc_load_generator_drives_a_real_etcd(tmp_path, capsys):
    with etcd_process(str(tmp_path)) as etcd:
        code, doc, err = bench_json(
            capsys,
            "put",
            "--total",
            "300",
            "--clients",
            "16",
            "--conns",
            "4",
            "--procs",
            "2",
            "--key-space-size",
            "20",
            "--sequential-keys",
            "--endpoints",
            etcd.url,
            protocol="grpc",
        )
        assert code == 0, err
        assert doc["count"] == 300 and doc["errors"] == 0
        got = etcd.post("/v3/kv/range", {"key": "MA==", "range_end": "Og=="})  # "0".. ":"
        assert got["count"] == "20"  # sequential keys over both processes covered the space
        assert int(got["header"]["revision"]) == 1 + 300  # each put applied once
        r = run(
            BenchOptions(
                op="range", endpoints=[etcd.url], clients=4, total=50, protocol="grpc"
            ).validate()
        )
        assert (r.stats.count, r.stats.error_count) == (50, 0)
