"""Test helpers for the HTTP API: a served app over ``LocalKV`` and small codecs.

``async with serve() as api:`` starts ``build_client_app`` on a loopback port with aiohttp's
``TestServer``/``TestClient`` and stops it afterwards (tests that use it are ``async def``;
tests/conftest.py runs them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from kvserver.api.http import build_client_app
from kvserver.kvpb.kv import RangeRequest
from kvserver.server.metrics import Metrics

from .fakes import LocalKV


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


@dataclass
class Api:
    client: TestClient
    service: LocalKV
    metrics: Metrics

    async def post(
        self,
        path: str,
        body: Any = None,
        *,
        raw: bytes | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """POST JSON (``body`` serialized, or ``raw`` bytes as is); (status, decoded JSON)."""
        data = raw if raw is not None else json.dumps({} if body is None else body)
        resp = await self.client.post(path, data=data, headers=headers)
        text = await resp.text()
        return resp.status, json.loads(text) if text else None

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, Any]:
        """(status, body bytes, headers) of any request."""
        resp = await self.client.request(method, path, data=data, headers=headers)
        return resp.status, await resp.read(), resp.headers

    def snapshot(self) -> tuple[int, list[Any]]:
        """The store's revision and every live key-value (to check nothing changed)."""
        store = self.service.store
        kvs = store.apply(RangeRequest(b"\0", b"\0")).response.kvs
        return store.revision, list(kvs)


@asynccontextmanager
async def serve(service: LocalKV | None = None, **options: Any) -> AsyncIterator[Api]:
    service = service if service is not None else LocalKV()
    metrics = Metrics(process_metrics=False)
    app = build_client_app(service, metrics, **options)
    async with TestClient(TestServer(app)) as client:
        yield Api(client, service, metrics)
