"""The chaos suite: faults against three real ``raftkv serve`` processes while clients work.

Run it by hand (root, for the network namespaces that partitions need)::

    .venv/bin/python -m tests.chaos --duration 60 --nemesis kill,pause,restart,partition \\
        --failover-kills 20 --out chaos-out

or in CI as ``pytest -m chaos tests/chaos`` (``test_chaos_ci.py``). docs/reliability.md says
what each nemesis does, what is checked, and the figures of a run.

Modules: ``netns`` (namespaces, bridge, partitions, cleanup), ``members`` (the launcher),
``kvhttp`` (the gateway requests), ``workloads`` (register, bank, lock, failover prober),
``watchers`` (watch streams and history replay), ``nemesis`` (the faults), ``checks`` (pure
judgments), ``runner`` (one run and its report), ``plot`` (the PNG timeline),
``docker_members`` (the compose target: deploy/'s three containers and Docker's faults,
``python -m tests.chaos --target compose``; CI: ``test_chaos_compose.py``).
"""
