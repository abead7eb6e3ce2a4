"""bolt's file format (the database under etcd's ``member/snap/db`` and in its snapshot files):
the layout (``bolt.format``), a checking reader (``bolt.reader``) and a writer
(``bolt.writer``). Pure: no imports of ours beyond this package."""

from bolt.format import BoltError
from bolt.reader import BoltReader, Bucket, looks_like_bolt, open_file
from bolt.writer import BoltWriter, BucketRef

__all__ = [
    "BoltError",
    "BoltReader",
    "BoltWriter",
    "Bucket",
    "BucketRef",
    "looks_like_bolt",
    "open_file",
]
