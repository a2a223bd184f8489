from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request

from streamer.app import App
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.server.serve import Server, ServerConfig
from streamer.server.static import WEB_DIRECTORY, StaticFiles

REPO = Path(__file__).parents[2]
PAGE_FILES = {"index.html", "app.js", "connection.js", "resample.js", "transcript.js", "worklet.js", "style.css"}


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with App(ServerConfig(port=0), ScriptedEngine(words_from_text("hi", 0, 8000, 800))) as srv:
        yield srv


async def raw_get(
    srv: Server, target: str, method: str = "GET", headers: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """Send the request line as given (no client-side normalisation of ``..`` or ``%2e``)."""

    def run() -> bytes:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    raw = await asyncio.to_thread(run)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), fields, body


def test_the_page_is_in_the_package_and_clients_web_is_the_same_directory() -> None:
    assert {p.name for p in WEB_DIRECTORY.iterdir()} >= PAGE_FILES
    assert (REPO / "clients" / "web").resolve() == WEB_DIRECTORY.resolve()


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", "text/html; charset=utf-8"),
        ("/index.html", "text/html; charset=utf-8"),
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/worklet.js", "text/javascript; charset=utf-8"),
        ("/style.css", "text/css; charset=utf-8"),
    ],
)
async def test_files_are_served_with_their_content_type_and_cache_headers(
    server: Server, path: str, content_type: str
) -> None:
    status, headers, body = await raw_get(server, path + "?v=1")
    assert status == 200
    assert headers["Content-Type"] == content_type
    assert headers["Cache-Control"] == "no-cache" and headers["ETag"].startswith('"')
    assert headers["X-Content-Type-Options"] == "nosniff"
    name = "index.html" if path == "/" else path[1:]
    assert body == (WEB_DIRECTORY / name).read_bytes()
    assert ("Content-Security-Policy" in headers) == content_type.startswith("text/html")


async def test_an_unchanged_file_costs_a_304_and_head_has_no_body(server: Server) -> None:
    _, headers, _ = await raw_get(server, "/app.js")
    status, _, body = await raw_get(server, "/app.js", headers=f"If-None-Match: {headers['ETag']}\r\n")
    assert (status, body) == (304, b"")
    status, head_headers, body = await raw_get(server, "/app.js", method="HEAD")
    assert status == 200 and body == b"" and head_headers["Content-Length"] == headers["Content-Length"]


@pytest.mark.parametrize(
    "target",
    [
        "/nope.js",
        "/../pyproject.toml",
        "/..%2fpyproject.toml",
        "/%2e%2e/server.py",
        "/web/../server.py",
        "//etc/passwd",
        "/./app.js",
        "/index.html/",
        "/.hidden",
        "/server.py",
    ],
)
async def test_unknown_paths_and_traversal_get_404(server: Server, target: str) -> None:
    status, _, body = await raw_get(server, target)
    assert status == 404
    assert b"import" not in body and b"root:" not in body


def test_only_known_types_inside_the_directory_are_served(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text("<p>hi</p>")
    (tmp_path / "notes.md").write_text("# not served")
    (tmp_path / ".secret.js").write_text("no")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mod.js").write_text("export {}")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.js"
    outside.write_text("no")
    (tmp_path / "link.js").symlink_to(outside)
    files = StaticFiles(tmp_path)
    assert set(files.files) == {"/page.html", "/sub/mod.js"}
    assert files.respond(Request("/notes.md", Headers())) is None
    response = files.respond(
        Request("/page.html", Headers()),
    )
    assert response is not None and response.status_code == 200
    post = files.respond(Request("/page.html", Headers(), "POST"))
    assert post is not None and post.status_code == 405
    assert StaticFiles(tmp_path / "missing").files == {}


def test_a_built_wheel_ships_the_page(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("streamer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"streamer/web/{name}" for name in PAGE_FILES} <= names
