"""What the chaos tests need of the machine: network namespaces (root, iproute2, iptables)."""

from __future__ import annotations

import os

import pytest

from tests.chaos import netns
from tests.conftest import external_required


def need_netns() -> None:
    """Skip without network namespaces; fail instead when CI (RAFTKV_REQUIRE_EXTERNAL=1)
    runs as root and they still do not work."""
    reason = netns.unavailable_reason()
    if reason is None:
        return
    if os.geteuid() == 0 and external_required():
        pytest.fail(f"{reason} (RAFTKV_REQUIRE_EXTERNAL=1: .ci/run installs iproute2/iptables)")
    pytest.skip(reason)
