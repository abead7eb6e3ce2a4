"""``POST /v3/maintenance/alarm``: etcd's Maintenance.Alarm over the JSON gateway.

GET lists the raised alarms (of the ``alarm`` type given; NONE: all) as this member knows
them after a ReadIndex barrier; ACTIVATE and DEACTIVATE go through the raft log, so every
member changes alike, and answer the pair they changed. Shapes: ``gateway_json.decode_alarm``
and ``encode_alarm``. With auth enabled the call needs root (``auth``: maintenance paths).
"""

from __future__ import annotations

from aiohttp import web

from . import gateway_json
from .common import LIMITS_KEY, SERVICE_KEY, json_response, read_body


async def maintenance_alarm(request: web.Request) -> web.Response:
    body = await read_body(request, request.app[LIMITS_KEY].max_body_bytes)
    resp = await request.app[SERVICE_KEY].alarm(gateway_json.decode_alarm(body))
    return json_response(gateway_json.encode_alarm(resp))


ROUTES = (("/maintenance/alarm", maintenance_alarm),)
