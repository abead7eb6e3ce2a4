"""Fixtures for the client tests: a started fake cluster (see ``fakeserver``)."""

import pytest

from tests.client.fakeserver import Blackhole, FakeCluster


@pytest.fixture
def cluster():
    c = FakeCluster(size=3, leader_index=0).start()
    yield c
    c.close()


@pytest.fixture
def blackhole():
    b = Blackhole()
    yield b
    b.close()
