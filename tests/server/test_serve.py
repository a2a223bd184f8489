from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.core.audio import encode_mulaw, resample
from streamer.engine.fake import FakeBehaviour, ScriptedEngine
from streamer.server.metrics import percentile
from streamer.server.scheduler import SchedulerOptions
from streamer.server.serve import Server
from tests.conftest import load_clip
from tests.helpers import (
    CLIP,
    WORDS,
    chunks,
    config,
    exchange,
    http_get,
    kinds,
    pcm16,
    received_seconds,
    speech,
    until,
)


async def test_happy_path_ready_then_finals_then_done_then_1000(server: Server) -> None:
    audio = speech()
    messages, code = await exchange(server, [*chunks(pcm16(audio)), '{"type":"end"}'])
    assert code == 1000
    assert messages[0]["type"] == "ready"
    assert messages[0] | {"session_id": "x"} == {
        "type": "ready",
        "session_id": "x",
        "model": "tiny.en",
        "sample_rate": 16000,
        "encoding": "pcm_s16le",
        "channels": 1,
        "resumed": False,
        "audio_seconds_received": 0.0,
        "resume_from": 0.0,
        "protocol": "v1",
    }
    assert messages[-1]["type"] == "done"
    finals = [m for m in messages if m["type"] == "final"]
    assert len(finals) >= 2  # two utterances
    assert "speech_started" in kinds(messages)
    # the scripted words come out once each, in order
    numbers = [int(word[1:]) for m in finals for word in m["text"].split()]
    assert len(numbers) > 10 and numbers == sorted(set(numbers))
    # finals never overlap and go forward in stream time
    for before, after in itertools.pairwise(finals):
        assert before["end"] <= after["start"] + 1e-6
    done = messages[-1]
    # every accepted sample is accounted for
    assert done["audio_seconds_received"] == pytest.approx(len(audio) / 16000, abs=1e-4)
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-4)
    assert done["non_speech_seconds"] > 0.5
    assert sum(f["end"] - f["start"] for f in finals) == pytest.approx(done["audio_seconds_transcribed"], abs=1e-3)


async def test_latency_fields_are_present_and_done_summarises_them(server: Server) -> None:
    # how large latencies are is for `streamer bench`: here, that each transcript carries one and done sums them up
    messages, _ = await exchange(server, [*chunks(pcm16(speech())), '{"type":"end"}'])
    for kind in ("partial", "final"):
        transcripts = [m for m in messages if m["type"] == kind]
        assert transcripts
        values = [m["latency_ms"] for m in transcripts]
        expected = {"p50": round(percentile(values, 50) or 0, 1), "p95": round(percentile(values, 95) or 0, 1)}
        assert messages[-1]["latency"][kind] == pytest.approx(expected, abs=0.05)
        for m in transcripts:
            for word in m["words"]:
                assert m["start"] - 1e-6 <= word["start"] <= word["end"] <= m["end"] + 1e-6
                assert 0 <= word["probability"] <= 1


async def test_mulaw_at_8khz_is_resampled_and_accounted(server: Server) -> None:
    audio = resample(speech(), 16000, 8000)
    messages, code = await exchange(
        server, [*chunks(encode_mulaw(audio), 1601), '{"type":"end"}'], "?sample_rate=8000&encoding=mulaw"
    )
    assert code == 1000
    done = messages[-1]
    assert done["audio_seconds_received"] == pytest.approx(len(audio) / 8000, abs=1e-3)
    assert any(m["type"] == "final" for m in messages)


async def test_two_channels_get_a_transcript_each(server: Server) -> None:
    left = speech()
    right = np.zeros_like(left)  # silence on the right channel
    stereo = np.stack([left, right], axis=1).reshape(-1)
    messages, code = await exchange(server, [*chunks(pcm16(stereo), 6401), '{"type":"end"}'], "?channels=2")
    assert code == 1000
    assert messages[0]["channels"] == 2
    finals = [m for m in messages if m["type"] == "final"]
    assert finals and {m["channel"] for m in finals} == {0}
    assert all("channel" in m for m in messages if m["type"] in ("partial", "final", "speech_started"))
    done = messages[-1]
    # seconds are summed over channels
    assert done["audio_seconds_received"] == pytest.approx(2 * len(left) / 16000, abs=1e-3)
    assert done["non_speech_seconds"] >= len(right) / 16000 - 1e-3


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("?sample_rate=96000", "sample_rate"),
        ("?encoding=mp3", "encoding"),
        ("?channels=6", "channels"),
        ("?bitrate=5", "unknown query parameter"),
    ],
)
async def test_bad_query_gets_error_then_4415(server: Server, query: str, complaint: str) -> None:
    messages, code = await exchange(server, [], query)
    assert code == 4415
    assert kinds(messages) == ["error"]
    assert messages[0]["code"] == "unsupported_audio"
    assert complaint in messages[0]["message"]


@pytest.mark.parametrize("frame", ["{not json", '{"type":"flush"}', '["end"]'])
async def test_bad_text_frames_get_error_then_4400(server: Server, frame: str) -> None:
    messages, code = await exchange(server, [pcm16(load_clip(CLIP)[:8000]), frame])
    assert code == 4400
    assert messages[0]["type"] == "ready"
    assert messages[-1]["type"] == "error" and messages[-1]["code"] == "bad_message"


async def test_frame_too_large_gets_error_then_1009() -> None:
    async with App(config(max_frame_bytes=4000), ScriptedEngine(WORDS)) as srv:
        messages, code = await exchange(srv, [b"\0" * 2000, b"\0" * 4002])
    assert code == 1009
    assert messages[-1]["code"] == "frame_too_large"
    assert "4000" in messages[-1]["message"]


async def test_idle_timeout_gets_error_then_4408_after_the_finals() -> None:
    async with App(config(idle_timeout=0.5), ScriptedEngine(WORDS)) as srv:
        messages, code = await exchange(srv, chunks(pcm16(load_clip(CLIP)[: 3 * 16000])))
    assert code == 4408
    assert messages[-1]["code"] == "idle_timeout"
    assert "final" in kinds(messages)  # what was heard is still delivered
    assert kinds(messages).index("final") < len(messages) - 1


async def test_keepalive_holds_off_the_idle_timeout() -> None:
    # keepalives 0.25 s apart for 2 s, twice the idle timeout: the margin against a busy machine is 0.75 s a gap
    async with App(config(idle_timeout=1.0), ScriptedEngine(WORDS)) as srv:
        frames = ['{"type":"keepalive"}'] * 8 + ['{"type":"end"}']
        messages, code = await exchange(srv, frames, pause=0.25)
    assert code == 1000
    assert messages[-1]["type"] == "done"


async def test_at_capacity_gets_error_then_1013() -> None:
    cfg = replace(config(), scheduler=SchedulerOptions(max_sessions=1))
    async with App(cfg, ScriptedEngine(WORDS)) as srv:
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen") as first:
            assert json.loads(await first.recv())["type"] == "ready"
            messages, code = await exchange(srv, [])
        assert code == 1013
        assert messages == [{"type": "error", "code": "at_capacity", "message": messages[0]["message"]}]
        assert 'streamer_admission_rejections_total{route="listen"} 1.0\n' in srv.metrics.render()


async def test_shutdown_flushes_finals_then_closes_1001() -> None:
    srv = App(config(), ScriptedEngine(WORDS))
    await srv.start()
    async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", max_queue=None) as ws:
        assert json.loads(await ws.recv())["type"] == "ready"
        for frame in chunks(pcm16(load_clip(CLIP)[: 4 * 16000])):
            await ws.send(frame)
        await until(lambda: received_seconds(srv) == pytest.approx(4.0))  # every frame is in
        shutdown = asyncio.create_task(srv.shutdown())
        messages = []
        with pytest.raises(ConnectionClosed):
            while True:
                messages.append(json.loads(await ws.recv()))
        await shutdown
    assert ws.close_code == 1001
    assert messages[-1]["code"] == "shutting_down"
    finals = [m for m in messages if m["type"] == "final"]
    # the 4 s heard before the shutdown are all committed
    assert finals and finals[-1]["end"] == pytest.approx(4.0, abs=0.05)


async def test_an_engine_failure_costs_one_window_and_the_server_keeps_serving() -> None:
    engine = ScriptedEngine(WORDS, FakeBehaviour(fail_calls=frozenset({2})))
    async with App(config(), engine) as srv:
        messages, code = await exchange(srv, [*chunks(pcm16(speech())), '{"type":"end"}'], pause=0.01)
        again, again_code = await exchange(srv, [*chunks(pcm16(speech())), '{"type":"end"}'])
    assert code == 1000
    errors = [m for m in messages if m["type"] == "error"]
    assert len(errors) == 1 and errors[0]["code"] == "engine_failure"
    lost = errors[0]["lost"]
    assert 0 <= lost["start"] < lost["end"]
    assert "Fake" not in errors[0]["message"]  # internals stay in the log
    done = messages[-1]
    assert done["lost_seconds"] == pytest.approx(lost["end"] - lost["start"], abs=1e-3)
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-4)
    # the next session is unaffected
    assert again_code == 1000 and again[-1]["lost_seconds"] == 0


async def test_readyz_is_503_until_the_engine_is_set_then_200_while_healthz_is_always_200() -> None:
    async with App(config(), engine=None) as srv:
        status, _, body = await http_get(srv.port, "/readyz")
        assert (status, body) == (503, "loading the model\n")
        status, _, body = await http_get(srv.port, "/healthz")  # alive while it loads: no restart
        assert (status, body) == (200, "ok\n")
        status, _, _ = await http_get(srv.port, "/v1/listen")
        assert status == 503
        srv.set_engine(ScriptedEngine(WORDS))
        status, _, body = await http_get(srv.port, "/readyz")
        assert (status, body) == (200, "ready\n")
        status, _, body = await http_get(srv.port, "/healthz")
        assert (status, body) == (200, "ok\n")


async def test_metrics_and_404(server: Server) -> None:
    await exchange(server, [*chunks(pcm16(speech())), '{"type":"end"}'])
    status, headers, body = await http_get(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "streamer_active_sessions 0.0\n" in body
    assert 'streamer_sessions_total{route="listen"} 1.0\n' in body
    assert "# TYPE streamer_final_latency_seconds histogram" in body
    assert "streamer_queue_depth" in body
    received = next(line for line in body.splitlines() if line.startswith("streamer_audio_seconds_received_total"))
    assert float(received.split()[1]) == pytest.approx(len(speech()) / 16000, abs=1e-3)
    status, _, _ = await http_get(server.port, "/nope")
    assert status == 404


async def test_permessage_deflate_offered_by_a_client_is_declined(server: Server) -> None:
    # websockets' serve() accepts deflate by default: a small compressed frame could inflate past every limit
    async with ws_connect(f"ws://127.0.0.1:{server.port}/v1/listen", compression="deflate") as ws:
        assert "permessage-deflate" in (ws.request.headers.get("Sec-WebSocket-Extensions") or "")  # type: ignore[union-attr]
        assert ws.response is not None and ws.response.headers.get("Sec-WebSocket-Extensions") is None
        assert json.loads(await ws.recv())["type"] == "ready"


@pytest.mark.parametrize(("vad", "heard"), [("webrtc", True), ("silero", False)])
async def test_the_vad_option_reaches_the_streams(vad: str, heard: bool) -> None:
    import argparse

    from streamer.cli.serve import config_from_args, configure_parser, load_vad
    from streamer.core.vad import VadBackend
    from streamer.engine.fake import synthetic_voice
    from tests.helpers import WORDS

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert config_from_args(parser.parse_args([])).core.vad.backend is VadBackend.WEBRTC
    chosen = config_from_args(parser.parse_args(["--port", "0", "--vad", vad]))
    assert chosen.core.vad.backend is VadBackend(vad)
    load_vad(chosen.core)
    # a buzzing harmonic tone with a syllabic rhythm: WebRTC's detector takes it for speech, Silero's network does not
    tone = synthetic_voice(3 * 16000)
    async with App(chosen, ScriptedEngine(WORDS)) as srv:
        messages, code = await exchange(srv, [*chunks(pcm16(tone)), '{"type":"end"}'])
    assert code == 1000
    assert ("speech_started" in kinds(messages)) is heard
