from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from websockets.asyncio.client import connect as ws_connect

from streamer.app import App
from streamer.cli import main as cli
from streamer.cli import top
from streamer.engine.fake import ScriptedEngine
from streamer.server.auth import AuthOptions
from streamer.server.status import EngineSnapshot, LatencyPercentiles, SessionSnapshot, StatusReport
from tests.helpers import WORDS, chunks, config, pcm16, speech

KEY = "k" * 24


def report(**overrides: object) -> StatusReport:
    session = SessionSnapshot(
        id="3f9a1c0b2e4d",
        kind="listen",
        age_seconds=3725.0,
        channels=2,
        audio_seconds=41.94,
        lag_seconds=0.3,
        uncommitted_seconds=1.25,
        partial_latency_ms=LatencyPercentiles(380.2, 610.0),
        final_latency_ms=LatencyPercentiles(None, None),
    )
    engine = EngineSnapshot(0.314, 0.08, 1, 3, 16, 5120, 3 * 2**29)
    fields: dict[str, object] = dict(
        model="tiny.en", ready=True, draining=False, uptime_seconds=812.4, engine=engine, sessions=(session,)
    )
    return StatusReport(**(fields | overrides))  # type: ignore[arg-type]


def test_the_report_round_trips_through_json() -> None:
    assert StatusReport.from_json(report().to_json()) == report()
    with pytest.raises(ValueError, match="not a /status report"):
        StatusReport.from_json('{"model": "tiny.en"}')


def test_render_lines_up_a_row_per_session_under_the_engine() -> None:
    text = top.render(report(), "http://h:1")
    head, engine, blank, columns, row = text.splitlines()
    assert head == "streamer top  http://h:1  model tiny.en  ready  up 13:32"
    assert engine == "engine   load 31%  rtf 0.080  queue 1  sessions 3/16  batches 5120  gpu 1.50 GiB"
    assert blank == ""
    assert columns.split()[:3] == ["SESSION", "KIND", "AGE"]
    assert row.split() == ["3f9a1c0b2e4d", "listen", "1:02:05", "2", "41.9s", "0.3s", "1.2s", "380/610", "ms", "-"]
    assert columns.index("AUDIO") == row.index("41.9s")  # aligned
    assert "\x1b[" not in text
    assert "\x1b[1m" in top.render(report(), "http://h:1", color=True)


def test_render_before_the_model_and_while_draining() -> None:
    loading = top.render(report(ready=False, engine=None, sessions=()), "u")
    assert "loading the model" in loading and "engine   not loaded yet" in loading
    assert loading.endswith("(no live sessions)")
    assert "  draining  " in top.render(report(ready=False, draining=True), "u")


async def test_streamer_top_once_shows_a_live_session(capsys: pytest.CaptureFixture[str]) -> None:
    async with App(config(), ScriptedEngine(WORDS)) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen") as ws:
            ready = json.loads(await ws.recv())
            for frame in chunks(pcm16(speech()[: 2 * 16000])):
                await ws.send(frame)
            code = await asyncio.to_thread(cli.main, ["top", "--url", url, "--once"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"streamer top  {url}  model tiny.en  ready" in out
    assert "sessions 1/16" in out
    (row,) = [line for line in out.splitlines() if line.startswith(ready["session_id"])]
    assert row.split()[1] == "listen"


async def test_streamer_top_needs_the_key_when_the_server_has_keys(capsys: pytest.CaptureFixture[str]) -> None:
    keyed = replace(config(), auth=AuthOptions(api_keys=frozenset({KEY})))
    async with App(keyed, ScriptedEngine(WORDS)) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        refused = await asyncio.to_thread(cli.main, ["top", "--url", url, "--once"])
        allowed = await asyncio.to_thread(cli.main, ["top", "--url", url, "--once", "--api-key", KEY])
    assert (refused, allowed) == (5, 0)
    err = capsys.readouterr().err
    assert "GET /status answered 401 Unauthorized (give --api-key)" in err


def test_an_unreachable_server_is_one_line_and_exit_5(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top", "--url", "http://127.0.0.1:9", "--once"]) == 5
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("streamer: error: cannot reach http://127.0.0.1:9")
