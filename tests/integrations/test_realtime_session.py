"""/v1/realtime?intent=transcription, driven by the official ``openai`` package."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.core.audio import encode_alaw, encode_mulaw, resample
from streamer.core.stream import CoreOptions
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.integrations.pipeline import Phase
from streamer.integrations.realtime_session import RealtimeOptions, RealtimeSession
from streamer.server.adapter import LOST, Close
from streamer.server.auth import AuthOptions
from streamer.server.ratelimit import RateLimitOptions
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.session import SessionOptions
from tests.helpers import WORDS, pump

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
        pump(self.scheduler, self.engine)
        return self.events(now)

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
    kinds = [e["type"].rsplit(".", 1)[-1] for e in events if e["type"] != "input_audio_buffer.speech_started"]
    assert kinds[0] == "committed" and kinds[-1] == "completed" and "delta" in kinds
    assert events[-1]["transcript"].startswith("w0")


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
    assert realtime.events()[-1]["error"]["code"] == "shutting_down"
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
    async with Server(config, ScriptedEngine(WORDS)) as srv:
        yield srv


async def test_server_vad_turns_with_the_openai_client(server: Server) -> None:
    async with client(server.port).realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        await conn.session.update(session=session_update({"type": "audio/pcm", "rate": 24000}, {"type": "server_vad"}))
        audio = np.concatenate([speech_then_pause(2.0), speech_then_pause(1.5, seed=2)])
        await append(conn, pcm24(audio))
        events = await events_until(conn, 2)
    kinds = [e.type for e in events]
    assert kinds[0] == "session.updated"
    assert kinds.count("input_audio_buffer.speech_started") == 2
    completed = [e for e in events if e.type.endswith(".completed")]
    first, second = completed
    assert first.transcript.startswith("w0") and second.transcript  # the scripted words
    # the OpenAI order per item: speech_started, speech_stopped, committed, deltas, completed
    for item in completed:
        mine = [e.type.rsplit(".", 1)[-1] for e in events if getattr(e, "item_id", None) == item.item_id]
        assert mine[0] == "speech_started" and mine[1:3] == ["speech_stopped", "committed"] and mine[-1] == "completed"
        deltas = [e.delta for e in events if e.type.endswith(".delta") and e.item_id == item.item_id]
        assert "".join(deltas) == item.transcript
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert committed[1].previous_item_id == committed[0].item_id


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


async def test_appends_beyond_the_rate_limit_are_refused_and_what_was_accepted_is_transcribed() -> None:
    # one append of 131 s of g711_ulaw was once accepted at once: now appends are charged like /v1/listen's frames
    limit = RateLimitOptions(max_rate=1.0, burst_seconds=3.0)
    # the server's one audio rate limit (--max-audio-rate) is the session options', for every route that takes audio
    config = ServerConfig(port=0, auth=AuthOptions(api_keys=frozenset({KEY})), session=SessionOptions(rate_limit=limit))
    async with Server(config, ScriptedEngine(WORDS)) as srv:
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


@pytest.mark.model
async def test_openai_client_gets_completed_transcripts_from_tiny_en(shared_data: Path, tiny_engine: Any) -> None:
    import soundfile as sf

    from streamer.offline.normalize import normalize_english, word_error_rate

    audio, rate = sf.read(shared_data / "telephony" / "OSR_us_000_0010_8k.wav", dtype="float32")
    audio = np.concatenate([audio[: 7 * rate], np.zeros(2 * rate, dtype=np.float32)])
    reference = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
    async with (
        Server(ServerConfig(port=0), tiny_engine) as srv,
        client(srv.port).realtime.connect(model="gpt-4o-transcribe", extra_query={"intent": "transcription"}) as conn,
    ):
        await conn.recv()
        await conn.session.update(session=session_update({"type": "audio/pcmu"}, {"type": "server_vad"}))
        await append(conn, encode_mulaw(audio), 160)
        events = await events_until(conn, 2, timeout=120)
    text = " ".join(e.transcript for e in events if e.type.endswith(".completed"))
    # tiny.en on 8 kHz mu-law: the first sentence comes out as "the birch can be used on this smooth plank"
    assert word_error_rate([normalize_english(reference)], [normalize_english(text)]).wer < 0.4, text
    assert "glue the sheet to the dark blue background" in normalize_english(text)
