"""/v1/realtime?intent=transcription, driven by the official ``openai`` package."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from streamer.app import App
from streamer.core.audio import AudioFormat, Encoding, Resampler, WireDecoder, encode_alaw, encode_mulaw, resample
from streamer.core.events import Final, SpeechEnded
from streamer.core.options import CoreOptions
from streamer.core.stream import StreamCore
from streamer.engine.fake import FakeBehaviour, FakeEngineError, ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.integrations.realtime_session import RealtimeOptions, RealtimeSession
from streamer.server import auth
from streamer.server.adapter import LOST, Close
from streamer.server.auth import AuthOptions
from streamer.server.lifecycle import Phase
from streamer.server.ratelimit import RateLimitOptions
from streamer.server.scheduler import CoreClient, Scheduler, SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.session import Session
from streamer.server.session_options import SessionOptions
from tests.helpers import WORDS, pump, until

openai = pytest.importorskip("openai")

KEY = "sk-streamer-test-key-0123456789"


def pcm24(audio16k: npt.NDArray[np.float32]) -> bytes:
    return (np.clip(resample(audio16k, 16000, 24000), -1, 1) * 32767).astype("<i2").tobytes()


def speech_then_pause(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.concatenate([synthetic_voice(int(seconds * 16000), seed), synthetic_silence(2 * 16000)])


def client(port: int, key: str = KEY) -> Any:
    return openai.AsyncOpenAI(
        api_key=key, base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1"
    )


def session_update(fmt: dict[str, Any], turn_detection: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "transcription",
        "audio": {
            "input": {
                "format": fmt,
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": turn_detection,
            }
        },
    }


async def append(conn: Any, data: bytes, chunk: int = 9600) -> None:
    for i in range(0, len(data), chunk):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + chunk]).decode())


async def events_until(
    conn: Any, count: int, kind: str = "conversation.item.input_audio_transcription.completed", timeout: float = 20
) -> list[Any]:
    events: list[Any] = []
    async with asyncio.timeout(timeout):
        while sum(e.type == kind for e in events) < count:
            events.append(await conn.recv())
    return events


# -- the adapter alone: client events and `now` in, server events and a close out ------------------------------------


class Realtime:
    """A /v1/realtime adapter over a scheduler the test runs by hand (:func:`tests.helpers.pump`)."""

    def __init__(self, options: RealtimeOptions | None = None, beta: bool = False) -> None:
        self.engine = ScriptedEngine(WORDS)
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.adapter = RealtimeSession(self.scheduler, CoreOptions(), options or RealtimeOptions(), beta, now=0.0)

    def send(self, event: dict[str, Any], now: float = 0.0) -> list[dict[str, Any]]:
        """Send one client event, decode what it asks for, and return the server events it led to."""
        self.adapter.receive_text(json.dumps(event), now)
        self.decode()
        return self.events(now)

    def decode(self) -> None:
        """Decode every window offered, as :func:`tests.helpers.pump`, telling the streams of a batch the engine
        fails on that their windows are lost (as the scheduler's worker does)."""
        while (batch := self.scheduler.next_batch()) is not None:
            try:
                self.scheduler.deliver(batch, self.engine.decode(batch.requests))
            except FakeEngineError as failure:
                self.scheduler.fail(batch, str(failure))

    def events(self, now: float = 0.0) -> list[dict[str, Any]]:
        return [json.loads(frame) for frame in self.adapter.messages_to_send(now)]


def appended(audio: bytes) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}


@pytest.mark.parametrize(("beta", "created"), [(False, "session.created"), (True, "transcription_session.created")])
def test_the_adapter_says_what_the_session_is_first(beta: bool, created: str) -> None:
    [event] = Realtime(beta=beta).events()
    assert event["type"] == created and event["session"]["id"].startswith("sess_")


def test_an_utterance_becomes_an_item_with_the_openai_order_of_events() -> None:
    realtime = Realtime()
    realtime.events()
    update = realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcmu"}, None)})
    assert [e["type"] for e in update] == ["session.updated"]
    speech = encode_mulaw(resample(speech_then_pause(2.0), 16000, 8000))
    events = realtime.send(appended(speech), 1.0) + realtime.send({"type": "input_audio_buffer.commit"}, 2.0)
    kinds = [e["type"].rsplit(".", 1)[-1] for e in events]
    assert "speech_started" not in kinds  # no VAD events without turn detection
    # the text is final before the commit: deltas first, then the commit's committed and added, then the end
    assert kinds[0] == "delta" and kinds[-2:] == ["completed", "done"]
    assert kinds.index("committed") < kinds.index("added") < kinds.index("completed")
    assert events[-2]["transcript"].startswith("w0")
    assert len({e.get("item_id", e.get("item", {}).get("id")) for e in events}) == 1  # one item


def feed(realtime: Realtime, audio16k: npt.NDArray[np.float32], now: float, chunk_s: float = 0.25) -> list[Any]:
    """Append 16 kHz audio as PCM at 24 kHz in chunks, decoding after each; the server events after each chunk."""
    steps = []
    n = int(chunk_s * 16000)
    for i in range(0, len(audio16k), n):
        steps.append(realtime.send(appended(pcm24(audio16k[i : i + n])), now))
    return steps


def test_server_vad_deltas_stream_inside_the_turn_and_speech_stopped_comes_at_the_end_point() -> None:
    realtime = Realtime()
    realtime.events()
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcm"}, {"type": "server_vad"})})
    audio = speech_then_pause(4.0)
    events = [e for step in feed(realtime, audio, 1.0) for e in step]
    kinds = [e["type"].rsplit(".", 1)[-1] for e in events]
    # text final inside the turn goes out before the turn ends
    assert "delta" in kinds[: kinds.index("speech_stopped")]
    assert kinds.index("speech_stopped") < kinds.index("committed") < kinds.index("added")
    assert kinds[-2:] == ["completed", "done"] and kinds.index("speech_stopped") < len(kinds) - 2
    # audio_end_ms is the core's end point (SpeechEnded), not the end of the last word
    core = StreamCore(replace(CoreOptions(), endpoint_ms=500))
    core.receive_audio(audio)
    [ended] = [e for e in core.events_received() if isinstance(e, SpeechEnded)]
    [stopped] = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert abs(stopped["audio_end_ms"] - ended.end // 16) <= 1  # within the 24 kHz to 16 kHz resampler's rounding
    completed = events[-2]
    assert "".join(e["delta"] for e in events if e["type"].endswith(".delta")) == completed["transcript"]


def test_each_delta_goes_out_in_the_step_the_core_makes_its_final() -> None:
    """The native final latency: a /v1/listen final is sent when the core emits it; the delta must go out then too."""
    audio = speech_then_pause(4.0)
    realtime = Realtime()
    realtime.events()
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcm"}, None)})
    deltas = [sum(e["type"].endswith(".delta") for e in step) for step in feed(realtime, audio, 1.0)]
    # the same bytes through a bare core and the same scripted engine, step by step, as /v1/listen feeds it
    engine = ScriptedEngine(WORDS)
    core = StreamCore(CoreOptions())
    decoder = WireDecoder(AudioFormat(encoding=Encoding.PCM_S16LE, sample_rate=24000, channels=1))
    resampler = Resampler(24000, 16000)
    finals = []
    for i in range(0, len(audio), 4000):
        core.receive_audio(resampler.process(decoder.decode(pcm24(audio[i : i + 4000]))[0]))
        while requests := core.windows_to_decode():
            for result in engine.decode(requests):
                core.receive_decode_result(result)
        finals.append(sum(isinstance(e, Final) and bool(e.text.strip()) for e in core.events_received()))
    assert sum(deltas) > 1 and deltas == finals


def test_deltas_stream_before_any_commit_without_turn_detection() -> None:
    realtime = Realtime()
    realtime.events()
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcm"}, None)})
    events = [e for step in feed(realtime, speech_then_pause(4.0), 1.0) for e in step]
    assert [e["type"] for e in events] and all(e["type"].endswith(".delta") for e in events)
    committed = realtime.send({"type": "input_audio_buffer.commit"}, 2.0)
    assert [e["type"] for e in committed][:2] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert committed[0]["item_id"] == events[0]["item_id"]
    assert committed[-1]["type"] == "conversation.item.done"


def test_an_engine_failure_fails_the_item_with_the_error() -> None:
    realtime = Realtime()
    realtime.engine.behaviour = FakeBehaviour(fail_calls=frozenset({1, 2, 3, 4, 5, 6, 7, 8}))
    realtime.events()
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcm"}, {"type": "server_vad"})})
    events = [e for step in feed(realtime, speech_then_pause(2.0), 1.0) for e in step]
    [failed] = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.failed"]
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    assert failed["item_id"] == started["item_id"] and failed["error"]["code"] == "engine_failure"
    assert "lost" in failed["error"]["message"]
    assert not any(e["type"].endswith(".completed") for e in events)
    assert events[-1]["type"] == "conversation.item.done"  # the item still ends


def test_idle_timeout_ms_triggers_on_the_injected_clock_and_not_during_speech() -> None:
    realtime = Realtime()
    realtime.events()
    turn = {"type": "server_vad", "idle_timeout_ms": 5000}
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcm"}, turn)}, 0.0)
    assert realtime.adapter.next_deadline() == 60.0  # only the session's idle timeout before any audio
    realtime.send(appended(pcm24(synthetic_silence(16000))), 10.0)
    assert realtime.adapter.next_deadline() == 15.0
    realtime.adapter.receive_timer(14.9)
    assert realtime.events() == []
    realtime.adapter.receive_timer(15.0)
    events = realtime.events()
    assert [e["type"] for e in events][:2] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed"]
    assert events[0]["audio_start_ms"] == 0 and 900 <= events[0]["audio_end_ms"] <= 1000
    assert events[-2]["transcript"] == ""
    assert realtime.adapter.next_deadline() == 20.0  # again after the same quiet
    # speech stops the timer; the end of the utterance starts it again
    realtime.send(appended(pcm24(synthetic_voice(16000))), 16.0)
    assert realtime.adapter.next_deadline() == 76.0  # the session's idle timeout only
    realtime.send(appended(pcm24(synthetic_silence(16000))), 17.0)
    assert realtime.adapter.next_deadline() == 22.0


def test_the_transcription_options_reach_the_decoder() -> None:
    seen: list[Any] = []

    def script(request: Any) -> Any:
        seen.append(request.options)
        return WORDS

    realtime = Realtime()
    realtime.engine = ScriptedEngine(script)
    realtime.scheduler = Scheduler(realtime.engine, SchedulerOptions())
    realtime.adapter = RealtimeSession(realtime.scheduler, CoreOptions(), RealtimeOptions(), False, now=0.0)
    realtime.events()
    session = session_update({"type": "audio/pcm"}, {"type": "semantic_vad", "eagerness": "low"})
    session["audio"]["input"]["transcription"] |= {"prompt": "Aoife", "keywords": ["Siobhan"], "delay": "xhigh"}
    assert realtime.send({"type": "session.update", "session": session})[0]["type"] == "session.updated"
    feed(realtime, speech_then_pause(2.0), 1.0)
    assert seen and all(o.initial_prompt == "Aoife" and o.keywords == ("Siobhan",) for o in seen)
    assert realtime.adapter.transcriber is not None
    options = realtime.adapter.transcriber.track("input").core.options
    assert options.endpoint_ms == 1500 and options.agreement_n == 4 and options.alignatt_margin_ms == 1500
    # none of it may change once audio is in
    session["audio"]["input"]["transcription"]["keywords"] = ["other"]
    [error] = realtime.send({"type": "session.update", "session": session})
    assert error["type"] == "error" and "cannot change" in error["error"]["message"]


def test_a_language_the_model_cannot_serve_is_refused_in_languages_too() -> None:
    realtime = Realtime()
    realtime.events()
    session = session_update({"type": "audio/pcm"}, None)
    session["audio"]["input"]["transcription"] = {"languages": ["en", "fr"]}
    [error] = realtime.send({"type": "session.update", "session": session})
    assert error["error"]["param"] == "session.audio.input.transcription.languages"


def test_a_bad_event_gets_an_error_and_the_session_goes_on() -> None:
    realtime = Realtime()
    realtime.events()
    realtime.adapter.receive_bytes(b"\0", 1.0)
    realtime.adapter.receive_text("{", 1.0)
    errors = realtime.events()
    assert [e["error"]["code"] for e in errors] == ["invalid_json", "invalid_json"]
    assert realtime.adapter.close_action() is None and realtime.adapter.reading


def test_the_idle_timeout_flushes_then_says_why_and_closes_4408() -> None:
    realtime = Realtime(RealtimeOptions(idle_timeout=60.0, flush_timeout=10.0))
    realtime.events()
    realtime.send({"type": "session.update", "session": session_update({"type": "audio/pcmu"}, None)}, 5.0)
    speech = encode_mulaw(resample(synthetic_voice(16000), 16000, 8000))  # speech, no pause: not final yet
    realtime.send(appended(speech), 5.0)
    assert realtime.adapter.next_deadline() == 65.0
    realtime.adapter.receive_timer(65.0)
    assert realtime.adapter.phase is Phase.DRAINING and not realtime.adapter.reading
    assert realtime.adapter.next_deadline() == 75.0  # the flush is bounded
    pump(realtime.scheduler, realtime.engine)
    events = realtime.events()
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "idle_timeout"
    assert any(e["type"].endswith(".completed") for e in events)  # the last transcript first
    assert realtime.adapter.close_action() == Close(4408, "idle_timeout")


def test_a_flush_that_takes_too_long_is_cut_at_flush_timeout() -> None:
    realtime = Realtime(RealtimeOptions(flush_timeout=10.0))
    realtime.events()
    realtime.adapter.receive_text(json.dumps(appended(pcm24(synthetic_voice(16000)))), 1.0)  # never decoded
    realtime.adapter.receive_shutdown(2.0)
    realtime.adapter.receive_timer(11.0)
    assert realtime.adapter.close_action() is None
    realtime.adapter.receive_timer(12.0)
    events = realtime.events()
    assert events[-1]["error"]["code"] == "shutting_down"
    # the audio the engine did not finish fails its item, named, before the error says why the session ends
    [failed] = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.failed"]
    assert failed["error"]["message"] == "the engine did not finish this audio in time: 0.00-1.00 s of audio is lost"
    assert realtime.adapter.close_action() == Close(1001, "shutting_down")


def test_a_client_that_does_not_read_is_cut_with_slow_reader() -> None:
    realtime = Realtime(RealtimeOptions(send_buffer=16))
    for _ in range(20):
        realtime.adapter.receive_text("{", 1.0)  # an error event each, none read
    assert realtime.adapter.close_action() == Close(4408, "slow_reader")
    assert len(realtime.events()) == 16  # what was queued; the rest was dropped


def test_a_client_that_leaves_ends_the_session_at_once() -> None:
    realtime = Realtime()
    realtime.adapter.receive_text(json.dumps(appended(pcm24(synthetic_voice(16000)))), 1.0)
    realtime.adapter.receive_connection_lost(2.0)
    assert realtime.adapter.close_action() == LOST and realtime.adapter.next_deadline() is None
    realtime.adapter.release()
    assert realtime.scheduler.next_batch() is None  # it let go of the scheduler


# -- over a real server, with the official client -------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    config = ServerConfig(port=0, auth=AuthOptions(api_keys=frozenset({KEY})))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        yield srv


async def test_server_vad_turns_with_the_openai_client(server: Server) -> None:
    async with client(server.port).realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        await conn.session.update(session=session_update({"type": "audio/pcm", "rate": 24000}, {"type": "server_vad"}))
        audio = np.concatenate([speech_then_pause(4.0), speech_then_pause(1.5, seed=2)])
        await append(conn, pcm24(audio))
        events = await events_until(conn, 2, kind="conversation.item.done")
    kinds = [e.type for e in events]
    assert kinds[0] == "session.updated"
    assert kinds.count("input_audio_buffer.speech_started") == 2
    completed = [e for e in events if e.type.endswith(".completed")]
    first, second = completed
    assert first.transcript.startswith("w0") and second.transcript  # the scripted words
    # the GA order per item: speech_started, deltas as text is final (the first ones inside the turn),
    # speech_stopped, committed, added, the last deltas, completed, done
    for item in completed:
        mine = [e.type for e in events if item.item_id in (getattr(e, "item_id", None), _item_id(e))]
        assert mine[0] == "input_audio_buffer.speech_started" and mine[-1] == "conversation.item.done"
        order = ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added"]
        assert [k for k in mine if k in order] == order and mine[-2].endswith(".completed")
        deltas = [e.delta for e in events if e.type.endswith(".delta") and e.item_id == item.item_id]
        assert "".join(deltas) == item.transcript
    first_item = [e.type for e in events if first.item_id in (getattr(e, "item_id", None), _item_id(e))]
    assert first_item.index("conversation.item.input_audio_transcription.delta") < first_item.index(
        "input_audio_buffer.speech_stopped"
    )  # text before the turn ended
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert committed[1].previous_item_id == committed[0].item_id
    done = [e for e in events if e.type == "conversation.item.done"]
    assert done[0].item.content[0].transcript == first.transcript


def _item_id(event: Any) -> str | None:
    item = getattr(event, "item", None)
    return getattr(item, "id", None)


async def test_deltas_reach_the_openai_client_before_it_commits(server: Server) -> None:
    async with client(server.port).realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        await conn.recv()
        await conn.session.update(session=session_update({"type": "audio/pcm", "rate": 24000}, None))
        await append(conn, pcm24(speech_then_pause(4.0)))
        before = await events_until(conn, 1, kind="conversation.item.input_audio_transcription.delta")
        await conn.input_audio_buffer.commit()
        after = await events_until(conn, 1, kind="conversation.item.done")
    delta = before[-1]
    assert delta.delta.startswith("w0")
    kinds = [e.type for e in after]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("conversation.item.added")
    committed = next(e for e in after if e.type == "input_audio_buffer.committed")
    assert committed.item_id == delta.item_id
    completed = next(e for e in after if e.type.endswith(".completed"))
    assert completed.transcript.startswith(delta.delta)


@pytest.mark.parametrize(("name", "encode"), [("audio/pcmu", encode_mulaw), ("audio/pcma", encode_alaw)])
async def test_manual_commit_with_g711(server: Server, name: str, encode: Any) -> None:
    async with client(server.port).realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        await conn.recv()
        await conn.session.update(session=session_update({"type": name}, None))
        await append(conn, encode(resample(synthetic_voice(2 * 16000), 16000, 8000)), 1600)
        await conn.input_audio_buffer.commit()
        events = await events_until(conn, 1)
    kinds = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in kinds  # no VAD events without turn detection
    assert kinds.index("input_audio_buffer.committed") < kinds.index(
        "conversation.item.input_audio_transcription.completed"
    )
    assert events[-1].transcript.startswith("w0")


async def test_errors_have_openai_shape_and_the_session_goes_on(server: Server) -> None:
    async with client(server.port).realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        await conn.recv()
        await conn.send({"type": "response.create", "event_id": "evt_1"})  # type: ignore[arg-type]
        error = await conn.recv()
        assert error.type == "error" and error.error.code == "unknown_event" and error.error.event_id == "evt_1"
        await conn.session.update(session=session_update({"type": "audio/pcmu"}, None))
        assert (await conn.recv()).type == "session.updated"
        await conn.input_audio_buffer.commit()  # nothing appended
        error = await conn.recv()
        assert error.error.code == "input_audio_buffer_commit_empty"
        await append(conn, encode_mulaw(np.zeros(8000, dtype=np.float32)))
        await conn.session.update(session=session_update({"type": "audio/pcm", "rate": 24000}, None))
        error = await conn.recv()
        assert error.type == "error" and "cannot change" in error.error.message


async def test_beta_transcription_session_events(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    headers = {"Authorization": f"Bearer {KEY}", "OpenAI-Beta": "realtime=v1"}
    async with ws_connect(url, additional_headers=headers) as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "transcription_session.created"
        assert created["session"]["input_audio_format"] == "pcm16"
        await ws.send(
            json.dumps(
                {
                    "type": "transcription_session.update",
                    "session": {"input_audio_format": "g711_ulaw", "turn_detection": None},
                }
            )
        )
        updated = json.loads(await ws.recv())
        assert updated["type"] == "transcription_session.updated"
        assert updated["session"]["input_audio_format"] == "g711_ulaw" and updated["session"]["turn_detection"] is None


async def test_bad_key_is_refused_with_4401(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    async with ws_connect(url, additional_headers={"Authorization": "Bearer wrong-key-0123456789"}) as ws:
        error = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_api_key"
    assert ws.close_code == 4401


async def test_events_socket_needs_the_key_too(server: Server) -> None:
    async with ws_connect(f"ws://127.0.0.1:{server.port}/v1/calls/CA1/events") as ws:
        error = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert error["code"] == "unauthorized" and ws.close_code == 4401


async def refused(url: str, **kwargs: Any) -> tuple[dict[str, Any], int | None]:
    """The first event of a connection the server refuses, and its close code."""
    async with ws_connect(url, **kwargs) as ws:
        event = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    return event, ws.close_code


async def test_a_browser_connects_with_openais_subprotocols(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    offered = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{KEY}")]
    async with ws_connect(url, subprotocols=offered) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        assert ws.subprotocol == "realtime"  # browsers fail the connection unless one they offered is selected
    wrong = [Subprotocol("realtime"), Subprotocol("openai-insecure-api-key.wrong-key-0123456789")]
    event, code = await refused(url, subprotocols=wrong)
    assert event["error"]["code"] == "invalid_api_key" and code == 4401


async def test_client_secrets_are_ephemeral_keys_for_one_realtime_session(server: Server) -> None:
    api = openai.AsyncOpenAI(api_key=KEY, base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0)
    secret = await api.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
    )
    assert secret.session.type == "transcription" and secret.session.audio.input.format.type == "audio/pcmu"
    assert secret.expires_at == auth.token_expiry(secret.value)
    assert abs(secret.expires_at - time.time() - 60) < 30  # wall-clock Unix seconds
    # refused anywhere but /v1/realtime, and that uses nothing up
    listen = f"ws://127.0.0.1:{server.port}/v1/listen?sample_rate=16000"
    event, code = await refused(listen, additional_headers={"Authorization": f"Bearer {secret.value}"})
    assert event["code"] == "unauthorized" and code == 4401
    # the SDK given the secret as its API key: one session
    async with client(server.port, secret.value).realtime.connect(
        model="whisper-1", extra_query={"intent": "transcription"}
    ) as conn:
        assert (await conn.recv()).type == "session.created"
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    event, code = await refused(url, additional_headers={"Authorization": f"Bearer {secret.value}"})
    assert event["error"]["code"] == "invalid_api_key" and code == 4401
    # a secret is no API key: it cannot buy another
    with pytest.raises(openai.AuthenticationError):
        await client(server.port, secret.value).realtime.client_secrets.create()


async def test_an_expired_client_secret_is_refused(server: Server) -> None:
    api = openai.AsyncOpenAI(api_key=KEY, base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0)
    secret = await api.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 10})
    server.authenticator.clock = lambda: secret.expires_at + 0.5  # the wall clock, moved past the expiry
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    event, code = await refused(url, additional_headers={"Authorization": f"Bearer {secret.value}"})
    assert event["error"]["code"] == "invalid_api_key" and code == 4401


async def test_client_secrets_refuses_what_openai_refuses(server: Server) -> None:
    api = openai.AsyncOpenAI(api_key=KEY, base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        await api.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 99999})
    assert bad.value.code == "invalid_value" and bad.value.param == "expires_after.seconds"
    with pytest.raises(openai.BadRequestError) as bad:
        await api.realtime.client_secrets.create(session={"type": "realtime"})
    assert bad.value.param == "session.type"
    with pytest.raises(openai.AuthenticationError):
        await client(server.port, "wrong-key-0123456789").realtime.client_secrets.create()
    # a body over the route's 64 KiB: 413, unread, and the connection closed
    with pytest.raises(openai.APIStatusError) as large:
        await api.realtime.client_secrets.create(extra_body={"padding": "x" * 70000})
    assert large.value.status_code == 413


async def test_appends_beyond_the_rate_limit_are_refused_and_what_was_accepted_is_transcribed() -> None:
    # one append of 131 s of g711_ulaw was once accepted at once: now appends are charged like /v1/listen's frames
    limit = RateLimitOptions(max_rate=1.0, burst_seconds=3.0)
    # the server's one audio rate limit (--max-audio-rate) is the session options', for every route that takes audio
    config = ServerConfig(port=0, auth=AuthOptions(api_keys=frozenset({KEY})), session=SessionOptions(rate_limit=limit))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime?intent=transcription"
        # the timeout only guards against a hang (a server that accepted the append would send no error)
        async with asyncio.timeout(60), ws_connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()  # session.created
            await ws.send(
                json.dumps({"type": "session.update", "session": session_update({"type": "audio/pcmu"}, None)})
            )
            assert json.loads(await ws.recv())["type"] == "session.updated"
            speech = encode_mulaw(resample(synthetic_voice(2 * 16000), 16000, 8000))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()}))
            # 4 s more never fit in the 3 s bucket, however long the client waited: refused whole, the session goes on
            refused = {
                "type": "input_audio_buffer.append",
                "event_id": "evt_9",
                "audio": base64.b64encode(speech + speech).decode(),
            }
            await ws.send(json.dumps(refused))
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
            assert error["error"]["code"] == "rate_limited" and error["error"]["param"] == "audio"
            assert error["error"]["event_id"] == "evt_9" and "real time" in error["error"]["message"]
            (session,) = [s for s in srv.sessions if isinstance(s, RealtimeSession)]
            assert session.transcriber is not None
            core = session.transcriber.track("input").core
            assert 2 * 16000 - 100 <= core.samples_received <= 2 * 16000  # the first append, all of it, and no more
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            events = [json.loads(await ws.recv())]
            while events[-1]["type"] != "conversation.item.input_audio_transcription.completed":
                events.append(json.loads(await ws.recv()))
            assert events[-1]["transcript"].startswith("w0")  # the accepted audio is transcribed


async def caught_up(srv: Server, kind: type, track: Any, sent: int) -> None:
    """Wait until the one session of ``kind`` has received ``sent`` bytes of 8 kHz mu-law (less what its resampler
    holds back) and decoded every window they made due: each endpoint then sees the same windows, whatever the
    machine's speed, so that the comparison is of protocols, not of timing."""

    def client() -> CoreClient | None:
        sessions = [s for s in srv.sessions if isinstance(s, kind)]
        return track(sessions[0]) if sessions else None

    def idle() -> bool:
        c = client()
        return c is not None and c.core.samples_received >= 2 * sent - 64 and not c.offered and not c.core.pending

    await until(idle, timeout=120)


async def native_finals(srv: Server, data: bytes) -> str:
    """The text /v1/listen gives for 8 kHz mu-law ``data`` sent in 20 ms frames, as a telephony gateway does."""
    url = f"ws://127.0.0.1:{srv.port}/v1/listen?encoding=mulaw&sample_rate=8000"
    messages: list[dict[str, Any]] = []
    # no keepalive pings: the test waits on the decoder between seconds, on a machine other tests load too
    async with ws_connect(url, max_queue=None, ping_interval=None) as ws:
        for second in range(0, len(data), 8000):
            for i in range(second, min(len(data), second + 8000), 160):
                await ws.send(data[i : i + 160])
            await caught_up(srv, Session, lambda s: s.channels[0], min(len(data), second + 8000))
        await ws.send('{"type":"end"}')
        with contextlib.suppress(ConnectionClosed):
            while True:
                messages.append(json.loads(await ws.recv()))
    return " ".join(m["text"] for m in messages if m["type"] == "final")


async def openai_completed(srv: Server, data: bytes) -> tuple[str, list[Any]]:
    """The text the official client gets from /v1/realtime (server VAD) for the same ``data``, and its events."""
    # the test reads no event until the audio is in, so the client's queue is unbounded: with the default (16
    # messages) the client stops reading the socket, answers no keepalive ping, and the server drops it after 20 s
    # (1011) on a machine where decoding runs late enough to pile up that many events
    connecting = client(srv.port).realtime.connect(
        model="gpt-4o-transcribe",
        extra_query={"intent": "transcription"},
        websocket_connection_options={"ping_interval": None, "max_queue": None},
    )
    async with connecting as conn:
        await conn.recv()
        await conn.session.update(session=session_update({"type": "audio/pcmu"}, {"type": "server_vad"}))
        for second in range(0, len(data), 8000):
            await append(conn, data[second : second + 8000], 160)
            sent = min(len(data), second + 8000)
            await caught_up(srv, RealtimeSession, lambda s: s.transcriber and s.transcriber.track("input"), sent)
        # events are handled in order: once this update is answered, every turn of the audio has begun
        await conn.session.update(session=session_update({"type": "audio/pcmu"}, {"type": "server_vad"}))
        events: list[Any] = []
        async with asyncio.timeout(300):
            while True:
                events.append(await conn.recv())
                updated = sum(e.type == "session.updated" for e in events) == 2
                started = sum(e.type == "input_audio_buffer.speech_started" for e in events)
                ended = sum(e.type == "conversation.item.done" for e in events)
                if updated and ended == started:
                    break
    return " ".join(e.transcript for e in events if e.type.endswith(".completed")), events


@pytest.mark.model
async def test_the_openai_client_gets_the_native_word_error_rate_from_tiny_en(
    shared_data: Path, tiny_engine: Any
) -> None:
    import soundfile as sf

    from streamer.offline.normalize import normalize_english, word_error_rate

    audio, rate = sf.read(shared_data / "telephony" / "OSR_us_000_0010_8k.wav", dtype="float32")
    assert rate == 8000
    data = encode_mulaw(np.concatenate([audio, np.zeros(2 * rate, dtype=np.float32)]))
    reference = next(
        line.split("\t", 1)[1]
        for line in (shared_data / "telephony" / "transcripts.tsv").read_text().splitlines()
        if line.startswith("OSR_us_000_0010_8k.wav\t")
    )
    async with App(ServerConfig(port=0), tiny_engine) as srv:
        native = await native_finals(srv, data)
        realtime, events = await openai_completed(srv, data)

    def wer(text: str) -> float:
        return word_error_rate([normalize_english(reference)], [normalize_english(text)]).wer

    # the same audio, core and model: the same words, whichever protocol carries them (issue 17: within 0.5 points)
    assert abs(wer(realtime) - wer(native)) <= 0.005, (native, realtime)
    assert wer(realtime) < 0.3, realtime
    print(f"\nrealtime WER native {wer(native):.4f} openai {wer(realtime):.4f}")
    # several turns, and in each the first text went out before the turn ended
    items = [e.item_id for e in events if e.type == "input_audio_buffer.speech_stopped"]
    assert len(items) >= 5
    early = 0
    for item_id in items:
        mine = [e.type for e in events if getattr(e, "item_id", None) == item_id]
        deltas = [i for i, k in enumerate(mine) if k.endswith(".delta")]
        early += bool(deltas) and deltas[0] < mine.index("input_audio_buffer.speech_stopped")
    assert early >= 1
