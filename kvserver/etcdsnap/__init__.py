"""etcd's snapshot files as an interchange format: etcd's backend schema over ``bolt``.

``importer``: an etcd bolt database -> raftkv's state image (``raftkv snapshot restore``).
``exporter``: raftkv's state image -> an etcd bolt database (``Maintenance.Snapshot``,
``raftkv snapshot save --format etcd``). ``convert`` runs the exporter in a child process for
a member. ``schema`` is the bucket layout both follow; ``file`` recognises and checks files.
"""
