"""``backup.check_image`` decodes an image larger than the store loader's buffer bound (the
loader refuses to buffer more than ``_MAX_BUFFER_BYTES`` at once; a million keys make an
image larger than its 256 MiB): the image is fed a MiB at a time. The bound is made small
here so that a small image crosses it."""

from kvserver.archive.backup import check_image
from kvserver.lease.snapshot import encode_snapshot, frame_snapshot
from kvserver.mvcc import snapshot as mvcc_snapshot
from kvserver.mvcc.store import MVCCStore


def test_an_image_larger_than_the_loaders_buffer_bound_is_checked(monkeypatch):
    monkeypatch.setattr(mvcc_snapshot, "_MAX_BUFFER_BYTES", 2 << 20)
    s = MVCCStore()
    for i in range(20000):
        s.put(b"k%06d" % i, b"v" * 256)
    image = frame_snapshot(encode_snapshot([], [])) + b"".join(s.serialize(64 * 1024))
    assert len(image) > 4 << 20
    check_image(image)
