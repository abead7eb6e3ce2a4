"""Deterministic cluster simulation of the raft core with safety checkers.

Run: ``python -m tests.sim --seeds 2000 [--start S] [--nodes 3|5]`` (soak) or
``python -m tests.sim --seed S --nodes N --verbose`` (replay one seed, printing every event).
A failing seed prints that replay line; the same (seed, nodes) replays the same events.

Modules, one job each:
- ``scenario``: every knob of a run (raft config, network faults, nemesis, clients), drawn
  from (seed, nodes) only.
- ``cluster``: the discrete-event loop, the Ready-loop driver, network, nemesis, clients.
- ``disk``: a node's durable/volatile storage model (what survives a crash).
- ``kv``: the per-node put-only state machine, its snapshots and apply-sequence CRC chain.
- ``checkers``: incremental Raft safety checkers (election safety, log matching, committed
  entries, leader completeness, state machine safety).
- ``history``: client history and the incremental linearizable-read checker.
- ``runner`` / ``__main__``: run seeds, format failures and replay commands; the CLI.
"""
