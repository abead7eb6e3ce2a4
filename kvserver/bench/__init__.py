"""``raftkv bench``: a load generator in the spirit of etcd's ``benchmark`` tool.

Parts, each small:

- ``workloads``: ``BenchOptions`` (the flags, validated) and what each workload sends;
- ``http``: a persistent, pipelining HTTP/1.1 connection (the load generator's transport);
- ``grpc_client``: ``--protocol grpc``, the workloads as etcd's KV calls over grpc.aio
  channels (the other transport; raftkv and etcd alike);
- ``runner``: client coroutines in 1..N processes, exact merging of their measurements;
- ``watch``: the ``watch-latency`` workload (put → event latency);
- ``stats``: raw latency samples, percentiles, etcd's histogram;
- ``report``: etcd-style text report and the progress bar.

``kvserver.cli.bench`` is the command line; ``benchmarks/compare.py`` uses ``runner.run``
to compare raftkv, etcd and PySyncObj.
"""
