"""raftkv inside PySpark pipelines (extra ``spark``: ``pyspark>=4``, ``pyarrow``).

Two parts that depend only on the client library:

- the ``raftkv`` data source (``kvserver.spark.source``): batch read at one pinned revision,
  batch write in bounded transactions, a changefeed stream and an exactly-once streaming sink;
- driver-side coordination (``kvserver.spark.lock``, ``kvserver.spark.commitlog``,
  ``kvserver.spark.exactly_once``): a fenced lock, a commit log, an exactly-once
  ``foreachBatch`` wrapper. These need no Spark at all.

``register(spark)`` registers every data source of this package with a SparkSession.
"""


def register(spark) -> None:
    """Register the raftkv data sources with ``spark`` (``spark.read.format("raftkv")``)."""
    from kvserver.spark.source import RaftKVDataSource

    spark.dataSource.register(RaftKVDataSource)
    from kvserver.spark.wal_source import RaftKVWalDataSource  # format("raftkv-wal")

    spark.dataSource.register(RaftKVWalDataSource)
