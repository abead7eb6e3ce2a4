"""The changefeed's own options: admission control and the cold tier (the archive).

Parsed from ``SourceOptions.raw`` (every option as Spark gave it, lower-cased keys), so the
shared option parser only has to know their names:

``maxEventsPerTrigger``     at most this many events per micro-batch (Spark's admission
                            control: ``getDefaultReadLimit`` answers ``ReadMaxRows``); a
                            revision is never split, so a batch whose first revision alone
                            holds more events holds that revision whole. In the cold tier it
                            caps revisions instead (see ``changefeed``). Default: no cap.
``maxRevisionsPerTrigger``  at most this many store revisions per micro-batch (``end - start``),
                            in both tiers. Default: no cap in the hot tier, ``COLD_REVISIONS``
                            in the cold tier.
``archiveUrl``              the continuous archive (``raftkv serve --archive-url``): history
                            below the store's compact revision is read from it.
``coldPartitions``          cold batches are cut at archived snapshots into at most this many
                            time slices, replayed in parallel (default 1). A key's events of
                            one cold batch may then be in several partitions: the order per
                            key holds within a partition and by ``mod_revision``, not across
                            partitions.
``driverBufferBytes``       how many bytes of decoded events the driver keeps to hand each hot
                            partition its events (default ``DEFAULT_HOLD_BYTES``, 128 MiB);
                            0: every task reads its events from the store.
``archiveOptions``          fsspec/s3fs options of that URL, ``key=value,key=value`` as
                            ``raftkv serve --archive-options`` takes them (e.g.
                            ``endpoint_url=http://127.0.0.1:9000``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.spark.source.changefeed_plan import DEFAULT_HOLD_BYTES
from kvserver.spark.source.options import OptionError, SourceOptions

COLD_REVISIONS = 100_000  # default cap of a cold micro-batch, in revisions
MAX_CAP = 1 << 40


@dataclass(frozen=True, slots=True)
class ChangefeedOptions:
    max_events: int  # 0: no cap
    max_revisions: int  # 0: no cap (the cold tier then uses COLD_REVISIONS)
    archive_url: str  # "": no cold tier
    archive_options: tuple[str, ...]  # "key=value" items for kvserver.archive.store
    cold_partitions: int = 1  # time slices of a cold batch
    driver_buffer_bytes: int = DEFAULT_HOLD_BYTES  # 0: tasks read every hot batch

    @property
    def cold_revisions(self) -> int:
        caps = [c for c in (self.max_revisions, self.max_events) if c]
        return min(caps) if caps else COLD_REVISIONS


def _cap(raw: dict, name: str, lo: int = 1) -> int:
    text = raw.get(name.lower())
    if text is None:
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name}: want a positive integer, got {text!r}") from None
    if not lo <= value <= MAX_CAP:
        raise OptionError(f"option {name}: want {lo} <= {name} <= {MAX_CAP}, got {value}")
    return value


def changefeed_options(o: SourceOptions) -> ChangefeedOptions:
    raw = dict(o.raw)
    url = raw.get("archiveurl", "").strip()
    if url and "://" not in url:
        raise OptionError(
            f"option archiveUrl: want a URL such as file:///mnt/backup/raftkv or "
            f"s3://bucket/prefix (what raftkv serve --archive-url writes), got {url!r}"
        )
    items = tuple(i.strip() for i in raw.get("archiveoptions", "").split(",") if i.strip())
    for item in items:
        if "=" not in item or item.startswith("="):
            raise OptionError(f"option archiveOptions: want key=value items, got {item!r}")
    if items and not url:
        raise OptionError("option archiveOptions needs option archiveUrl")
    return ChangefeedOptions(
        max_events=_cap(raw, "maxEventsPerTrigger"),
        max_revisions=_cap(raw, "maxRevisionsPerTrigger"),
        archive_url=url,
        archive_options=items,
        cold_partitions=_cap(raw, "coldPartitions") or 1,
        driver_buffer_bytes=(
            _cap(raw, "driverBufferBytes", lo=0)
            if "driverbufferbytes" in raw
            else DEFAULT_HOLD_BYTES
        ),
    )
