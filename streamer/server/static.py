"""The browser client's files (``streamer/web/``, also reachable as ``clients/web/``), served over plain HTTP GET
through websockets' ``process_request`` hook.

Every file is read once, when :class:`StaticFiles` is built, into a table keyed by URL path; a request is a lookup
in that table, so no request path ever reaches the file system (no directory traversal, whatever the encoding).
``/`` is ``/index.html``. Files are revalidated on every load (``Cache-Control: no-cache`` with an ``ETag``), so a
new server version never leaves a browser with a stale mix of modules, and an unchanged file costs a 304.

The files live inside the package so that ``pip install .`` ships them (``[tool.setuptools.package-data]``) and an
editable install serves them from the checkout; ``clients/web`` is a symbolic link to the same directory.
"""

from __future__ import annotations

import email.utils
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["CONTENT_TYPES", "WEB_DIRECTORY", "StaticFile", "StaticFiles", "http_response"]

# where the page's files are installed: beside this module
WEB_DIRECTORY = Path(__file__).parent.parent / "web"

# the only file types served; ES modules and the AudioWorklet module need a JavaScript type to load at all
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
}

# The page loads only its own scripts, and connects only to its own origin ('self' covers ws: and wss: to the same
# host in CSP Level 3). The microphone is for this origin only.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Permissions-Policy": "microphone=(self)",
}
HTML_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


@dataclass(frozen=True)
class StaticFile:
    """One served file, held in memory."""

    body: bytes
    content_type: str
    # strong validator: a digest of the content (RFC 9110 section 8.8.3)
    etag: str


def http_response(
    status: HTTPStatus, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
) -> Response:
    """A complete HTTP response for ``process_request`` to return; the connection closes after it."""
    all_headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", content_type),
        ]
    )
    for name, value in (headers or {}).items():
        all_headers[name] = value
    return Response(status.value, status.phrase, all_headers, body)


class StaticFiles:
    """The files of ``directory`` (and its subdirectories), by URL path. Build once, at server start."""

    def __init__(self, directory: Path = WEB_DIRECTORY) -> None:
        self.directory = directory
        self.files: dict[str, StaticFile] = {}
        if directory.is_dir():
            root = directory.resolve()
            for path in sorted(directory.rglob("*")):
                relative = path.relative_to(directory)
                content_type = CONTENT_TYPES.get(path.suffix.lower())
                if content_type is None or not path.is_file() or any(p.startswith(".") for p in relative.parts):
                    continue
                if not path.resolve().is_relative_to(root):
                    continue  # a link out of the directory is not part of the page
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                self.files["/" + relative.as_posix()] = StaticFile(body, content_type, etag)

    def lookup(self, path: str) -> StaticFile | None:
        """The file served at URL ``path`` (without query), or None."""
        return self.files.get("/index.html" if path == "/" else path)

    def respond(self, request: Request) -> Response | None:
        """The response for ``request`` if its path is one of the files, else None (the caller routes on).

        Only GET and HEAD are answered; another method gets 405."""
        static = self.lookup(urlsplit(request.path).path)
        if static is None:
            return None
        headers = dict(SECURITY_HEADERS)
        headers["Cache-Control"] = "no-cache"
        headers["ETag"] = static.etag
        if static.content_type.startswith("text/html"):
            headers["Content-Security-Policy"] = HTML_POLICY
        if request.method not in ("GET", "HEAD"):
            headers = {"Allow": "GET, HEAD"}
            return http_response(HTTPStatus.METHOD_NOT_ALLOWED, b"", "text/plain; charset=utf-8", headers)
        if static.etag in _etags(request.headers.get("If-None-Match", "")):
            return http_response(HTTPStatus.NOT_MODIFIED, b"", static.content_type, headers)
        response = http_response(HTTPStatus.OK, static.body, static.content_type, headers)
        if request.method == "HEAD":
            response.body = b""  # Content-Length still says how long the body would be (RFC 9110 section 9.3.2)
        return response


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}
