"""pytest option for the interaction traces.

``--rewrite-traces`` is only recognized when pytest is pointed at this directory (pytest
reads options from the conftest files of the paths given on its command line), e.g.
``pytest tests/raft/interaction --rewrite-traces``; ``RAFT_TRACES_REWRITE=1`` works from
anywhere.
"""

import pytest

from tests.raft.interaction.runner import rewrite_requested_by_env


def pytest_addoption(parser):
    parser.addoption(
        "--rewrite-traces",
        action="store_true",
        default=False,
        help="rewrite the expected output of raft interaction traces in place",
    )


@pytest.fixture
def rewrite_traces(request) -> bool:
    return bool(request.config.getoption("--rewrite-traces", default=False)) or (
        rewrite_requested_by_env()
    )
