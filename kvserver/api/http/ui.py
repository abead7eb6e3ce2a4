"""The dashboard: ``/ui/`` on every member's client port (static files shipped in the package).

``GET /ui`` redirects to ``/ui/``; ``GET /ui/`` is ``ui_static/index.html``; ``GET /ui/{name}``
serves the other files of ``ui_static/`` (package data: the wheel carries them, nothing is
fetched from elsewhere at run time). Only files that exist in that directory are served (a
fixed table built once, so no path from a request ever reaches the filesystem).

The page reads the cluster through the gateway (``/v3/kv/range``, ``/v3/watch``,
``/v3/lease/*``, ``/v3/auth/*``) with the caller's token and through the JSON endpoints of
``kvserver.api.http.ui_data`` (``/ui/api/...``). It writes nothing unless the member runs with
``--ui-write`` (``UiConfig.write``), and then only through ``/ui/api/kv/put``,
``/ui/api/kv/delete`` and ``/ui/api/move-leader``.

Auth: with auth enabled, the files under ``/ui/`` need no token (the page is where one logs
in); the data endpoints check the caller's token and permissions themselves
(``ui_data.ui_user``), as the gateway's handlers do.
"""

from __future__ import annotations

import functools
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

PREFIX = "/ui"
STATIC_DIR = Path(__file__).resolve().parent / "ui_static"
_CACHE = "no-cache"  # the page and its scripts change with the member's version


@dataclass(frozen=True, slots=True)
class UiConfig:
    """What the member tells its dashboard. ``write``: ``--ui-write`` (put, delete, move
    leader from the page). ``archiver``: the ``--archive-url`` archiver (its ``manifest`` and
    ``lag()``), or None."""

    write: bool = False
    archiver: Any = None


UI_CONFIG_KEY = web.AppKey("raftkv_ui_config", UiConfig)


def _static_table() -> dict[str, tuple[bytes, str]]:
    table: dict[str, tuple[bytes, str]] = {}
    if not STATIC_DIR.is_dir():
        return table
    for path in sorted(STATIC_DIR.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(STATIC_DIR).as_posix()
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix == ".js":
            ctype = "text/javascript"
        table[rel] = (path.read_bytes(), ctype)
    return table


@functools.cache
def files() -> dict[str, tuple[bytes, str]]:
    """The shipped files by relative name (read once per process; read-only after)."""
    return _static_table()


def ui_config(request: web.Request) -> UiConfig:
    return request.app.get(UI_CONFIG_KEY) or UiConfig()


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound(PREFIX + "/")


async def static_file(request: web.Request) -> web.Response:
    name = request.match_info.get("name", "") or "index.html"
    found = files().get(name)
    if found is None:
        raise web.HTTPNotFound()
    body, ctype = found
    charset = "utf-8" if ctype.startswith("text/") or ctype.endswith("javascript") else None
    return web.Response(
        body=body,
        content_type=ctype,
        charset=charset,
        headers={"Cache-Control": _CACHE, "X-Content-Type-Options": "nosniff"},
    )


ROUTES = (
    ("GET", PREFIX, redirect),
    ("GET", PREFIX + "/", static_file),
    ("GET", PREFIX + "/{name:(?!api/).+}", static_file),
)
