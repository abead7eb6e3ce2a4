"""Interaction traces for the raft core, in the manner of etcd's raft/testdata.

``testdata/*.txt`` are trace files: commands run against a small environment of RawNodes
and the exact output expected, each file starting with comments saying what it shows.
``datadriven`` parses/compares/rewrites files, ``env`` drives the nodes as the Ready
contract says, ``commands`` lists every command, ``runner`` ties them together (and is a
command-line tool), ``test_traces`` runs every file under pytest.

Regenerate expectations after an intended change in the core, then review the diff:

    .venv/bin/pytest tests/raft/interaction --rewrite-traces
    RAFT_TRACES_REWRITE=1 .venv/bin/pytest tests/raft/interaction
    .venv/bin/python -m tests.raft.interaction.runner --rewrite [NAME...]
"""
