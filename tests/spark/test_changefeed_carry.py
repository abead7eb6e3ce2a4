"""The hot batch carried to its task (no Spark, no store): what the driver's watch received,
as Arrow, reads back as the same rows a task's own watch would give.

- ``arrow_ipc`` / ``ipc_batches`` round-trip ``event_batches`` exactly (PUTs, DELETEs, prev
  values, both value formats); no events is no batch;
- option ``driverBufferBytes``: default, 0 (tasks read from the store), refused values.
"""

from __future__ import annotations

import pytest

from kvserver.client import WatchEvent
from kvserver.kvpb.kv import EventType, KeyValue
from kvserver.spark.source.changefeed import arrow_ipc, event_batches, event_size, ipc_batches
from kvserver.spark.source.changefeed_options import changefeed_options
from kvserver.spark.source.changefeed_plan import DEFAULT_HOLD_BYTES
from kvserver.spark.source.options import OptionError, parse

pa = pytest.importorskip("pyarrow")


def options(**extra):
    return parse({"endpoints": "127.0.0.1:2379", "changefeed": "true", "prefix": "f/", **extra})


def events():
    out = []
    for i in range(20_000):  # more than one Arrow batch
        key = b"f/%05d" % (i % 700)
        if i % 97 == 5:
            out.append(WatchEvent(EventType.DELETE, KeyValue(key, mod_revision=100 + i)))
            continue
        prev = KeyValue(key, b"old%d" % i, 7, 99 + i, 1) if i % 3 else None
        kv = KeyValue(key, b"v%d" % i, 7, 100 + i, 2, lease=i % 5)
        out.append(WatchEvent(EventType.PUT, kv, prev))
    return out


@pytest.mark.parametrize(
    "extra", [{}, {"prevValue": "true"}, {"valueFormat": "string", "prevValue": "true"}]
)
def test_arrow_ipc_reads_back_as_event_batches(extra):
    o = options(**extra)
    evs = events()
    got = pa.Table.from_batches(list(ipc_batches(arrow_ipc(o, evs))))
    want = pa.Table.from_batches(list(event_batches(o, evs)))
    assert got.num_rows == len(evs)
    assert got.equals(want)
    assert list(ipc_batches(arrow_ipc(o, []))) == []


def test_event_size_counts_key_and_values():
    a, b = events()[1], events()[3]  # a put with its previous value, one without
    assert event_size(a) > event_size(b) > len(b.kv.key) + len(b.kv.value)


def test_driver_buffer_bytes_option():
    assert changefeed_options(options()).driver_buffer_bytes == DEFAULT_HOLD_BYTES
    assert changefeed_options(options(driverBufferBytes="0")).driver_buffer_bytes == 0
    assert changefeed_options(options(driverBufferBytes="4096")).driver_buffer_bytes == 4096
    for bad in ("-1", "lots"):
        with pytest.raises(OptionError, match="driverBufferBytes"):
            changefeed_options(options(driverBufferBytes=bad))
