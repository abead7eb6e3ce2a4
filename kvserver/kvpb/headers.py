"""HTTP header names and version strings that clients and members agree on.

A write carries ``X-Raftkv-Client-Id`` and ``X-Raftkv-Request-Id`` (decimal uint64): the client
id is fixed per client object, the request id is new per call and the same on every retry of
that call, so the state machine applies a retried write once. ``ETCD_VERSION`` is the etcd API
version the members speak (``GET /version``); ``RAFTKV_VERSION`` is raftkv's own.
"""

CLIENT_ID_HEADER = "X-Raftkv-Client-Id"
REQUEST_ID_HEADER = "X-Raftkv-Request-Id"
ETCD_VERSION = "3.5.0"  # the etcd API version we speak (GET /version)
RAFTKV_VERSION = "0.1.0"
