"""One HTTP attempt: the client's connection pool, and aiohttp's failures as typed errors.

``HttpTransport`` owns one ``aiohttp.ClientSession`` (keep-alive connections, at most
``max_connections``), created on first use; it belongs to the event loop that first used it
(another loop gets a ``ClientError``). ``send`` makes one request and returns the parsed JSON
of a 200 answer (``send_raw``: its bytes); ``open_stream`` starts a streamed answer (a watch) and returns the response
to read from. Both raise ``ConnectionFailedError`` (no connection, refused, a TLS handshake
that failed, a connection lost midway), ``RequestTimeoutError`` (no answer in time), the
error an HTTP status and body stand for (``errors.from_http``), or ``ResponseFormatError``
(an answer that is not JSON, or over ``max_response_bytes``). Nothing here retries: that is
``kvserver.client.retry``'s job.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import aiohttp

from kvserver.client.errors import (
    ClientError,
    ConnectionFailedError,
    RequestTimeoutError,
    ResponseFormatError,
    from_http,
)

_ERROR_BODY_BYTES = 64 * 1024  # read from a refused stream, for its error message


class HttpTransport:
    """The connection pool and single HTTP attempts (see the module docstring)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | bool,
        connect_timeout_s: float,
        max_connections: int,
        max_response_bytes: int,
    ) -> None:
        self._ssl = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._max_response_bytes = max_response_bytes
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None:
            if self._closed:
                raise ClientError("the client is closed")
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ttl_dns_cache=60, ssl=self._ssl
            )
            self._http = aiohttp.ClientSession(connector=connector)
            self._loop = loop
        elif loop is not self._loop:
            # aiohttp sessions (and the client's locks) belong to one loop.
            raise ClientError(
                "this AsyncClient was first used on another event loop; "
                "create one client per loop (or use the blocking Client)"
            )
        return self._http

    async def send(
        self,
        endpoint: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
    ) -> Any:
        """One HTTP attempt; the parsed JSON of a 200 answer, or a typed ``ClientError``."""
        raw = await self.send_raw(endpoint, method, path, body, headers, timeout_s)
        try:
            return json.loads(raw)
        except ValueError:
            snippet = raw[:80].decode("utf-8", "replace")
            raise ResponseFormatError(
                f"answer is not JSON: {snippet!r}", http_status=200, endpoint=endpoint
            ) from None

    async def send_raw(
        self,
        endpoint: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
    ) -> bytes:
        """One HTTP attempt; the body of a 200 answer as bytes (for a caller that decodes it
        itself), or a typed ``ClientError``."""
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(self._connect_timeout_s, timeout_s)
        )
        try:
            async with self._session().request(
                method, endpoint + path, data=body, headers=headers, timeout=timeout
            ) as resp:
                status = resp.status
                raw = await self._read_body(resp, endpoint)
        except aiohttp.ConnectionTimeoutError:
            raise ConnectionFailedError(
                f"cannot connect: no answer within {min(self._connect_timeout_s, timeout_s):g} s",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientSSLError as exc:  # (a ClientConnectorError) a refused handshake
            raise ConnectionFailedError(
                f"TLS handshake failed: {exc.os_error or exc}",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                reason = "connection refused"
            else:
                reason = exc.os_error.strerror or str(exc)
            raise ConnectionFailedError(
                f"cannot connect: {reason}", endpoints=(endpoint,), endpoint=endpoint
            ) from None
        except TimeoutError:
            raise RequestTimeoutError(
                f"no answer within {timeout_s:.3g} s", endpoint=endpoint
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionFailedError(
                f"connection lost: {exc or type(exc).__name__}",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientError as exc:
            raise ClientError(f"HTTP client error: {exc}", endpoint=endpoint) from None
        if status != 200:
            raise from_http(status, raw, endpoint)
        return raw

    async def _read_body(self, resp: aiohttp.ClientResponse, endpoint: str) -> bytes:
        limit = self._max_response_bytes
        if resp.content_length is not None:
            if resp.content_length > limit:
                raise ResponseFormatError(
                    f"answer of {resp.content_length} bytes is over the {limit}-byte limit",
                    endpoint=endpoint,
                )
            return await resp.read()  # the common case: one call, length already bounded
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise ResponseFormatError(
                    f"answer is over the {limit}-byte limit", endpoint=endpoint
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def open_stream(
        self, endpoint: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> aiohttp.ClientResponse:
        """POST ``body`` and return the response once a 200 answer starts (its body is the
        stream, read without a timeout); raise a typed error otherwise. ``timeout_s`` bounds
        getting the answer's status line."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_read=None, sock_connect=min(self._connect_timeout_s, timeout_s)
        )
        session = self._session()
        try:
            # ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` drops a cancel
            # of the caller that arrives as the call completes (CPython gh-86296), so a
            # cancelled ``__anext__`` would go on reading, and lose the event it returns.
            async with asyncio.timeout(timeout_s):
                resp = await session.post(
                    endpoint + path, data=body, headers=headers, timeout=timeout
                )
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            reason = (
                "connection refused"
                if isinstance(getattr(exc, "os_error", None), ConnectionRefusedError)
                else str(exc) or type(exc).__name__
            )
            raise ConnectionFailedError(
                f"cannot connect: {reason}", endpoints=(endpoint,), endpoint=endpoint
            ) from None
        except TimeoutError:
            raise RequestTimeoutError(
                f"no answer within {timeout_s:.3g} s", endpoint=endpoint
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            raise ConnectionFailedError(
                f"connection lost: {exc or type(exc).__name__}",
                endpoints=(endpoint,),
                endpoint=endpoint,
            ) from None
        except aiohttp.ClientError as exc:
            raise ClientError(f"HTTP client error: {exc}", endpoint=endpoint) from None
        if resp.status != 200:
            try:
                async with asyncio.timeout(timeout_s):
                    error_body = await resp.content.read(_ERROR_BODY_BYTES)
            except (TimeoutError, aiohttp.ClientError, ConnectionError):
                error_body = b""
            finally:
                resp.close()
            raise from_http(resp.status, error_body, endpoint)
        return resp
