"""What a txn's gets read: the Spark helpers' commits decide by reading in the branch that ran.

A commit txn is ``when(...).then(puts).otherwise(gets)``: when it fails, the ``otherwise``
branch ran and each of its answers is a get's (``RangeResult``). ``range_kvs(result, i)``
is the key-values of the ``i``-th answer, typed as such.
"""

from __future__ import annotations

from kvserver.client import RangeResult, TxnResult
from kvserver.kvpb.kv import KeyValue


def range_kvs(result: TxnResult, i: int) -> tuple[KeyValue, ...]:
    """The key-values read by the ``i``-th operation of the branch that ran (a get)."""
    answer = result.responses[i]
    if not isinstance(answer, RangeResult):
        raise TypeError(f"txn answer {i} is a {type(answer).__name__}, not a get's")
    return answer.kvs
