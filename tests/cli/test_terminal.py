from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
import pytest

from streamer.app import App
from streamer.cli import main as cli
from streamer.cli.main import main
from streamer.cli.terminal import CLEAR_LINE, DIM, LiveView, paced_chunks
from streamer.client import FinalDelay, StreamSummary
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.server.serve import Server, ServerConfig
from streamer.server.server_messages import Done, FinalMessage, LatencySummary, PartialMessage, Percentiles
from tests.conftest import DATA
from tests.helpers import FakeClock, config, received_by_session, received_seconds, until
from tests.tcp_proxy import tcp_proxy

WORDS = words_from_text(" ".join(f"w{i}" for i in range(200)), 0, 4000, 800)
CLIP = str(DATA / "1089-134686-0001.flac")


@pytest.fixture(autouse=True)
def only_the_stream_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() builds every subcommand's parser; these tests need only this one, not the others' imports
    monkeypatch.setattr(cli, "COMMANDS", {"stream": cli.COMMANDS["stream"]})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS)) as srv:
        yield srv


async def test_stream_file_as_json_lines(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stream", CLIP, "--url", f"ws://127.0.0.1:{server.port}", "--speed", "0", "--json"]
    code = await asyncio.to_thread(main, argv)
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["type"] == "ready"
    assert lines[-1]["type"] == "done"
    assert any(m["type"] == "final" and m["text"] for m in lines)


async def test_stream_file_prints_transcript_and_latency(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stream", CLIP, "--url", f"ws://127.0.0.1:{server.port}", "--speed", "0"]
    assert await asyncio.to_thread(main, argv) == 0
    out = capsys.readouterr().out
    assert "transcript:\nw" in out
    # the delay the speaker felt first, the server's share of it beside it and labelled so
    assert "final delay (speaker-felt): p50 " in out and "; server's share: p50 " in out
    assert "partial latency (server's share): p50 " in out
    assert "\x1b[" not in out  # not a terminal: no ANSI


def test_live_view_on_a_tty_rewrites_partials_dim_and_commits_finals() -> None:
    out = io.StringIO()
    view = LiveView(out=out, tty=True)
    view.show(PartialMessage(0, 0, " hel", 0.0, 0.5, (), 10.0))
    view.show(PartialMessage(0, 0, " hello wor", 0.0, 0.9, (), 10.0))
    view.show(FinalMessage(0, 0, " hello world", 0.0, 1.0, (), 20.0))
    latency = LatencySummary(Percentiles(10.0, 10.0), Percentiles(20.0, 20.0))
    view.show(Done(1.0, 1.0, 0.0, 0.0, latency))
    assert out.getvalue() == (f"{CLEAR_LINE}{DIM}hel\x1b[0m{CLEAR_LINE}{DIM}hello wor\x1b[0m{CLEAR_LINE}hello world\n")
    assert "hello world" in view.summary()
    # no measure of the client's (--json, say): the server's figure alone, labelled as its share
    assert "final latency (server's share): p50 20 ms, p95 20 ms" in view.summary()
    assert "partial latency (server's share): p50 10 ms, p95 10 ms" in view.summary()


def test_the_summary_says_the_speaker_felt_final_delay_beside_the_servers_share() -> None:
    view = LiveView(out=io.StringIO())
    view.show(FinalMessage(0, 0, " hello world", 0.0, 1.0, (), 243.0, seq=1))
    latency = LatencySummary(Percentiles(100.0, 150.0), Percentiles(243.0, 243.0))
    view.show(Done(1.0, 1.0, 0.0, 0.0, latency))
    delays = [FinalDelay(1, 0, 910.0, 243.0), FinalDelay(2, 0, 1240.0, 376.0)]
    view.measured = StreamSummary.of(view.done, delays)
    summary = view.summary()
    assert "final delay (speaker-felt): p50 1075 ms, p95 1224 ms; server's share: p50 310 ms, p95 369 ms" in summary
    assert "final latency" not in summary


async def paced(
    samples: npt.NDArray[np.float32], speed: float, clock: FakeClock, late: dict[int, float]
) -> list[tuple[float, npt.NDArray[np.float32]]]:
    """Each chunk of ``paced_chunks`` with the moment it came; the consumer takes ``late[index]`` seconds over one."""
    got = []
    async for piece in paced_chunks(samples, 3200, speed, clock=clock, sleep=clock.sleep):
        got.append((clock(), piece))
        clock.advance(late.get(len(got) - 1, 0.0))
    return got


async def test_paced_chunks_come_at_their_place_in_the_audio_divided_by_speed() -> None:
    samples = np.arange(16100, dtype=np.float32)  # 1 s and 100 samples
    clock = FakeClock(100.0)
    got = await paced(samples, 4.0, clock, {})
    # 3200 samples are 0.2 s of audio: at 4x, one every 0.05 s from the first
    assert [when - 100.0 for when, _ in got] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.25])
    assert [len(piece) for _, piece in got] == [3200] * 5 + [100]
    assert np.array_equal(np.concatenate([piece for _, piece in got]), samples)


async def test_a_late_consumer_gets_the_overdue_chunks_at_once_and_the_schedule_does_not_drift() -> None:
    clock = FakeClock()
    got = await paced(np.zeros(16000, dtype=np.float32), 4.0, clock, {1: 0.12})  # busy until 0.17 s
    # chunks 2 and 3 (due at 0.10 and 0.15 s) are overdue and come at once; chunk 4 keeps its time, 0.20 s
    assert [when for when, _ in got] == pytest.approx([0.0, 0.05, 0.17, 0.17, 0.2])


async def test_speed_0_sends_everything_without_waiting() -> None:
    clock = FakeClock()
    got = await paced(np.zeros(16000, dtype=np.float32), 0.0, clock, {})
    assert len(got) == 5 and clock.sleeps == [] and clock() == 0.0


def test_mic_without_sounddevice_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import fails even where it is installed
    assert main(["stream", "--mic"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "streamer: error: --mic needs the sounddevice package: pip install 'streamer[mic]'"


def test_file_or_mic_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream"]) == 2
    assert "give an audio FILE or --mic" in capsys.readouterr().err


def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", CLIP, "--url", "ws://127.0.0.1:9", "--speed", "0"]) == 5
    assert "cannot reach ws://127.0.0.1:9" in capsys.readouterr().err


async def test_a_refused_handshake_says_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # a server still loading its model, asked without reconnection: its status and reason, not a traceback
    async with App(ServerConfig(port=0), engine=None) as srv:
        url = f"ws://127.0.0.1:{srv.port}"
        assert await asyncio.to_thread(main, ["stream", CLIP, "--url", url, "--speed", "0", "--no-reconnect"]) == 5
    err = capsys.readouterr().err.strip()
    assert err == f"streamer: error: {url} refused the session: HTTP 503 (the server is not ready)"


async def test_a_server_still_loading_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    # started right after `streamer serve`: the client asks again until the model is warm, then streams the file
    async with App(ServerConfig(port=0), engine=None) as srv, tcp_proxy(srv.port) as proxy:
        argv = ["stream", CLIP, "--url", f"ws://127.0.0.1:{proxy.port}", "--speed", "0", "--json"]
        streaming = asyncio.create_task(asyncio.to_thread(main, argv))
        await until(lambda: proxy.connections >= 1)  # refused: the model is not loaded
        srv.set_engine(ScriptedEngine(WORDS))
        assert await streaming == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["type"] == "ready" and lines[-1]["type"] == "done" and lines[-1]["lost_seconds"] == 0


async def test_a_dropped_connection_is_resumed_and_the_transcript_is_the_uncut_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with App(config(resume_grace_seconds=30.0), ScriptedEngine(WORDS)) as srv, tcp_proxy(srv.port) as proxy:
        argv = ["stream", CLIP, "--url", f"ws://127.0.0.1:{proxy.port}", "--speed", "4"]
        assert await asyncio.to_thread(main, argv) == 0
        uncut = capsys.readouterr().out
        # the server lets go of the finished session as its runner ends, just after the client saw the close
        await until(lambda: not received_by_session(srv))
        command = asyncio.create_task(asyncio.to_thread(main, argv))
        await until(lambda: received_seconds(srv) >= 1.5)  # mid-file
        [session_id] = received_by_session(srv).keys() - {None}
        proxy.hold()
        proxy.cut()
        await until(lambda: session_id in srv.resumable)
        proxy.release()
        assert await command == 0
        cut = capsys.readouterr().out
    assert f"[reconnected: resumed, session {session_id}]" in cut
    transcript = cut.split("transcript:\n")[1].splitlines()[0]
    assert transcript == uncut.split("transcript:\n")[1].splitlines()[0]
    assert "reconnected 1 times; lost by the client's buffer 0.00 s" in cut
    assert "lost 0.00 s" in cut


def test_reconnect_options_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", CLIP, "--buffer-seconds", "0"]) == 2
    assert "buffer_seconds must be > 0" in capsys.readouterr().err
