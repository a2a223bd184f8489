"""The ``streamer top`` command: a live view of a running server, from its ``GET /status``.

Polls ``/status`` every ``--interval`` seconds and redraws a table in the terminal with plain ANSI escapes: the
engine (load, real-time factor, queue depth, sessions against the limit) and one row per live session (age,
audio, lag, latency percentiles). ``--once`` prints one table and exits (scripts, tests). Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from typing import TextIO

from streamer.core.errors import ConfigError, ProtocolError
from streamer.server.status import LatencyPercentiles, StatusReport

__all__ = ["configure_parser", "fetch", "render", "run"]

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"

COLUMNS = ("SESSION", "KIND", "AGE", "CH", "AUDIO", "LAG", "UNCOMMITTED", "PARTIAL p50/p95", "FINAL p50/p95")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default="http://127.0.0.1:8765", help="the server's HTTP address (default: %(default)s)"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="print the table once and exit")
    parser.add_argument(
        "--api-key", default=None, help="an API key, when the server has keys (default: $STREAMER_API_KEY)"
    )
    parser.add_argument("--no-color", action="store_true", help="no bold or dim text (also when not a terminal)")


def run(args: argparse.Namespace) -> int:
    """``streamer top``: one table with ``--once``, else a refreshing view until Ctrl-C."""
    if args.interval <= 0:
        raise ConfigError("--interval must be > 0")
    api_key = args.api_key or os.environ.get("STREAMER_API_KEY") or None
    url = args.url.rstrip("/")
    color = not args.no_color and sys.stdout.isatty()
    if args.once:
        print(render(fetch(url, api_key), url, color=color))
        return 0
    out: TextIO = sys.stdout
    try:
        while True:
            try:
                screen = render(fetch(url, api_key), url, color=color)
            except ProtocolError as error:
                screen = f"streamer top: {url}: {error} (retrying every {args.interval:g} s)"
            out.write(CLEAR + screen + "\n")
            out.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def fetch(url: str, api_key: str | None = None, timeout: float = 5.0) -> StatusReport:
    """``GET {url}/status``; raise :class:`~streamer.core.errors.ProtocolError` (exit 5) with a one-line reason."""
    request = urllib.request.Request(f"{url}/status", headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as error:
        hint = " (give --api-key)" if error.code == 401 else ""
        raise ProtocolError(f"GET /status answered {error.code} {error.reason}{hint}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ProtocolError(f"cannot reach {url}: {reason}") from error
    try:
        return StatusReport.from_json(body)
    except ValueError as error:
        raise ProtocolError(f"{url}/status: {error}") from error


def render(report: StatusReport, url: str, color: bool = False) -> str:
    """The whole screen for ``report`` as text (ANSI bold/dim only when ``color``)."""
    bold, dim, reset = (BOLD, DIM, RESET) if color else ("", "", "")
    state = "draining" if report.draining else "ready" if report.ready else "loading the model"
    lines = [f"{bold}streamer top{reset}  {url}  model {report.model}  {state}  up {_duration(report.uptime_seconds)}"]
    engine = report.engine
    if engine is None:
        lines.append("engine   not loaded yet")
    else:
        gpu = "-" if engine.gpu_memory_bytes is None else f"{engine.gpu_memory_bytes / 2**30:.2f} GiB"
        lines.append(
            f"engine   load {engine.load:.0%}  rtf {engine.real_time_factor:.3f}  queue {engine.queue_depth}  "
            f"sessions {engine.active_sessions}/{engine.max_sessions}  batches {engine.batches}  gpu {gpu}"
        )
    lines.append("")
    rows = [COLUMNS]
    for s in report.sessions:
        rows.append(
            (
                s.id,
                s.kind,
                _duration(s.age_seconds),
                str(s.channels),
                f"{s.audio_seconds:.1f}s",
                f"{s.lag_seconds:.1f}s",
                f"{s.uncommitted_seconds:.1f}s",
                _latency(s.partial_latency_ms),
                _latency(s.final_latency_ms),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for index, row in enumerate(rows):
        text = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        lines.append(f"{dim}{text}{reset}" if index == 0 else text)
    if not report.sessions:
        lines.append("(no live sessions)")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _latency(p: LatencyPercentiles) -> str:
    if p.p50 is None or p.p95 is None:
        return "-"
    return f"{p.p50:.0f}/{p.p95:.0f} ms"
