"""A real S3 API on loopback for the tests: moto's server as a child process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request

from kvserver.localcluster.launcher import free_ports
from tests.support.procs import stop_process


@contextlib.contextmanager
def moto_server(tmp_path):
    port = free_ports(1)[0]
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        stop_process(proc, 10)
        log.close()


def s3_env(endpoint: str) -> dict:
    """What s3fs/botocore read from the environment (no option needed on the command line)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


def make_bucket(endpoint: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True
    )
    fs.mkdir(bucket)
