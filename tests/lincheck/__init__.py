"""lincheck: record a concurrent history and check that it is linearizable.

A Wing–Gong search with Lowe's memoization (the design of porcupine), partitioned by key, in
plain Python. Used by the multi-process tests (DESIGN section 7, item 4): several clients
drive real ``raftkv serve`` processes while the test kills and restarts nodes, every request
is recorded with its call and return time, and afterwards the history must have a valid
sequential order.

Recording a history in a multi-process test
-------------------------------------------
The servers are processes; the clients are threads or asyncio tasks inside the test process
that share one :class:`History`::

    from tests.lincheck import History, KvModel, assert_linearizable, kv

    history = History()                      # time.monotonic_ns, thread-safe

    def client(cid: int, c: "kvserver.client.Client") -> None:
        for n in range(200):
            key = f"k{rng.randrange(5)}"
            if rng.random() < 0.5:
                value = f"{cid}-{n}"         # unique values make violations visible
                with history.record(cid, kv.put(key, value)) as rec:
                    rev = c.put(key, value)  # any exception -> unknown outcome (info)
                    rec.ok(kv.put_ok(rev))
            else:
                with history.record(cid, kv.get(key)) as rec:
                    found = c.get(key)       # a linearizable read
                    rec.ok(kv.get_ok(found.value if found else None,
                                     found.mod_revision if found else None))

    # ... run the clients while SIGKILLing / restarting the leader ...
    assert_linearizable(KvModel(), history)  # AssertionError with a readable explanation

Rules for recording: call ``invoke``/``record`` just before sending and ``ok`` just after the
response arrives. A request whose outcome is unknown (timeout, connection reset, the node
died) must be recorded as ``info`` (the ``with`` block does that on any exception), never
dropped: it may still be applied later. Use ``fail`` only for requests the server
*definitely* rejected without applying (a 4xx validation error). Write unique values so a
stale or phantom read cannot pass by coincidence. Serializable (local) reads are not
linearizable by design; do not record them. Clients in other processes can record their own
:class:`History` (``time.monotonic_ns`` is system-wide on Linux) and send back
``operations()`` (picklable); join them with :func:`merge_operations`.

The async form is the same (``History`` never blocks): ``with history.record(...)`` around an
``await``.

What it guarantees
------------------
- ``ILLEGAL`` only for histories that are truly not linearizable (sound): the search explores
  every order consistent with real time before saying so; overlapping or touching intervals,
  pending operations (placed anywhere after their call, or never) and unreported response
  fields all only widen what is allowed. The explanation gives the longest linearizable
  prefix found, the operation that could not be placed, and the candidates that were tried,
  with call and return times.
- ``OK`` only with a witness: ``result.partitions[i].linearization`` is a valid order.
- ``UNKNOWN`` when the step budget (``max_steps_per_partition``, deterministic) or the
  optional ``timeout_s`` runs out -- the checker never hangs and never guesses.
- Per-key partitioning checks per-key linearizability: cross-key properties (e.g. that
  etcd's global revision orders different keys consistently) are not checked.

Cost: per partition, roughly the number of operations times the concurrency on that key for
linearizable histories; a non-linearizable one is searched exhaustively up to the violation,
bounded by the memoized configurations. ``python -m tests.lincheck.bench`` prints the
throughput on a 2,000-operation, 10-key, 8-client history.

Modules: ``history`` (recorder, :class:`Operation`), ``model`` (the model protocol), ``kv``
(the key-value model), ``checker`` (the search), ``generate`` (random histories from a real
sequential execution, for tests and the benchmark).
"""

from tests.lincheck import kv
from tests.lincheck.checker import (
    DEFAULT_MAX_STEPS_PER_PARTITION,
    Candidate,
    CheckResult,
    Counterexample,
    PartitionResult,
    Verdict,
    assert_linearizable,
    check,
)
from tests.lincheck.history import (
    INFINITY,
    History,
    HistoryError,
    Operation,
    OpHandle,
    Recording,
    merge_operations,
)
from tests.lincheck.kv import KvInput, KvModel, KvOpKind, KvOutput
from tests.lincheck.model import Model

__all__ = [
    "DEFAULT_MAX_STEPS_PER_PARTITION",
    "INFINITY",
    "Candidate",
    "CheckResult",
    "Counterexample",
    "History",
    "HistoryError",
    "KvInput",
    "KvModel",
    "KvOpKind",
    "KvOutput",
    "Model",
    "OpHandle",
    "Operation",
    "PartitionResult",
    "Recording",
    "Verdict",
    "assert_linearizable",
    "check",
    "kv",
    "merge_operations",
]
