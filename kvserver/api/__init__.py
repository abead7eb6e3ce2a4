"""kvserver.api: the client-facing dialects, each a thin layer over one ``KVService``.

``http`` serves etcd's v3 JSON gateway, plain REST and the operational endpoints over
HTTP/1.1. Every dialect maps its wire format onto the typed requests of ``kvserver.kvpb`` and
calls the same service (``kvserver.server.service.KVService``); none holds state of its own.
"""
