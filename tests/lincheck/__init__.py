"""lincheck: record a concurrent history and check that it is linearizable.

A Wing–Gong search with Lowe's memoization (the design of porcupine), partitioned by key, in
plain Python. Used by the multi-process tests: several clients
drive real ``raftkv serve`` processes while the test kills and restarts nodes, every request
is recorded with its call and return time, and afterwards the history must have a valid
sequential order.

Recording a history in a multi-process test
-------------------------------------------
The servers are processes; the clients are threads or asyncio tasks inside the test process
that share one :class:`History`::

    from tests.lincheck import History, KvModel, assert_linearizable, kv

    history = History()                           # time.monotonic_ns, thread-safe

    def client(cid: int, c: "kvserver.client.Client", rng: random.Random) -> None:
        for n in range(200):
            key = f"k{rng.randrange(5)}"
            try:
                if rng.random() < 0.5:
                    value = f"{cid}-{n}"          # unique values expose stale/phantom reads
                    with history.record(cid, kv.put(key, value)) as rec:
                        rev = c.put(key, value)   # on any exception: recorded as unknown
                        rec.ok(kv.put_ok(rev))
                else:
                    with history.record(cid, kv.get(key)) as rec:
                        found = c.get(key)        # a linearizable read
                        rec.ok(kv.get_ok(found.value if found else None,
                                         found.mod_revision if found else None))
            except (TimeoutError, ConnectionError):
                pass                              # `with` recorded info(); carry on

    # ... run the clients while SIGKILLing / restarting the leader, then:
    assert_linearizable(KvModel(), history)       # AssertionError with a readable explanation

Rules for recording:

- ``invoke``/``record`` reads the clock just before the request is sent, ``ok`` just after
  the response arrived: the recorded interval must contain the real one.
- A request whose outcome is unknown (timeout, connection reset, the node died) is ``info``
  -- leaving the ``with`` block by an exception does that and re-raises -- never dropped: it
  may still be applied later. ``fail`` only for requests the server *definitely* rejected
  without applying (a 4xx validation error).
- Write unique values, so a stale or phantom read cannot pass by coincidence.
- Record only linearizable operations; serializable (local) reads are stale by design.
- Clients in other processes can keep their own :class:`History` (``time.monotonic_ns`` is
  system-wide on Linux), send back ``operations()`` (picklable) and be joined with
  :func:`merge_operations`.

The async form is the same (``History`` never blocks): ``with history.record(...)`` around an
``await``. ``check`` instead of ``assert_linearizable`` returns a :class:`CheckResult`
(``verdict``, per-partition ``steps``, witness ``linearization`` or ``counterexample``, and
``explanation``).

What it guarantees
------------------
- ``ILLEGAL`` only for histories that are truly not linearizable (sound): the search explores
  every order consistent with real time before saying so; overlapping or touching intervals,
  pending operations (placed anywhere after their call, or never) and unreported response
  fields all only widen what is allowed. The explanation gives the longest linearizable
  prefix found, the operation that could not be placed, and the candidates that were tried,
  with call and return times. (Given a correct model; the KV model's pruning of pending
  writes and its greedy reads are exact, and both are cross-checked against brute force.)
- ``OK`` only with a witness: ``result.partitions[i].linearization`` is a valid order.
- ``UNKNOWN`` when the step budget (``max_steps_per_partition``, deterministic, default
  2,000,000 ≈ 1-2 s) or the optional ``timeout_s`` runs out -- the checker never hangs and
  never guesses. A test should treat UNKNOWN as a failure to check, not as a pass.
- Per-key partitioning checks per-key linearizability: cross-key properties (e.g. that
  etcd's global revision orders writes of different keys consistently) are not checked.

Cost
----
Linearizable histories cost about one step per operation when keys are spread (the
benchmark -- 2,000 operations, 10 keys, 8 clients, 3 crashes -- takes ~2,500 steps, a few
milliseconds). A violation is found after exhausting the configurations before it; that
grows with the concurrency on one key and, above all, with the number of *pending writes*
on that key (each may or may not have applied). Measured: one hot key, 8 clients, 2,000
operations: ~60,000 steps without crashes, ~840,000 with 3 crashes. Spread a chaos test over
a few keys and use unique values: a pending put whose value nobody read is then pruned (unless
a later delete reporting ``deleted=1`` or a failed CAS on the key could depend on it).
``python -m tests.lincheck.bench`` prints the throughput.

Modules: ``history`` (recorder, :class:`Operation`), ``model`` (the model protocol), ``kv``
(the key-value model), ``checker`` (the search), ``generate`` (random histories from a real
sequential execution), ``reference`` (brute-force oracle for the tests), ``bench``.
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
