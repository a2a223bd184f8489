"""Malformed input on every endpoint that takes client input: each case gets an ``error`` and its documented close
code (or, on ``/v1/realtime``, an error event and the session goes on), beside a healthy stream that must not
notice."""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass, replace
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.call_centre import CallCentreOptions
from streamer.integrations.realtime import MAX_APPEND_BYTES
from streamer.integrations.twilio import MAX_MESSAGE_CHARS
from streamer.integrations.twilio_session import TwilioOptions
from streamer.server.client_messages import MAX_TEXT_FRAME_CHARS
from streamer.server.serve import ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import until
from tests.reliability.helpers import LONG_WORDS, looped_speech, stream
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

# hang guard: an answer this late means none came (past SessionOptions.idle_timeout, so a session the server failed
# to close shows as 4408 idle_timeout, not as a timeout here)
HANG_SECONDS = 30.0

MAX_FRAME = SessionOptions().max_frame_bytes  # 1 MiB; websockets refuses messages over 4 MiB itself
NAN = struct.pack("<f", float("nan"))
INF = struct.pack("<f", float("inf"))
END = '{"type":"end"}'


@dataclass(frozen=True)
class Case:
    """Frames sent on ``path``; the last message must be ``error`` with ``code`` (or ``done`` when code is None),
    then the close ``close_code``."""

    name: str
    frames: tuple[str | bytes, ...]
    code: str | None
    close_code: int
    path: str = "/v1/listen"


LISTEN = [
    Case("invalid JSON", ("{not json",), "bad_message", 4400),
    Case("unknown type", ('{"type":"flush"}',), "bad_message", 4400),
    Case("JSON array", ('["end"]',), "bad_message", 4400),
    Case("JSON string", ('"end"',), "bad_message", 4400),
    Case("JSON number", ("5",), "bad_message", 4400),
    Case("type is a number", ('{"type":5}',), "bad_message", 4400),
    Case("type is null", ('{"type":null}',), "bad_message", 4400),
    Case("no type", ("{}",), "bad_message", 4400),
    Case("extra field", ('{"type":"end","now":true}',), "bad_message", 4400),
    Case("empty text frame", ("",), "bad_message", 4400),
    Case("NUL bytes in text", ("\0\0\0",), "bad_message", 4400),
    Case("huge text frame", ('{"type":"end","pad":"' + "x" * MAX_TEXT_FRAME_CHARS + '"}',), "frame_too_large", 1009),
    Case("binary frame over max_frame_bytes", (b"\0" * (MAX_FRAME + 2),), "frame_too_large", 1009),
    Case("NaN in pcm_f32le", (NAN * 100,), "bad_message", 4400, "/v1/listen?encoding=pcm_f32le"),
    Case("+Inf in pcm_f32le", (b"\0" * 400 + INF,), "bad_message", 4400, "/v1/listen?encoding=pcm_f32le"),
    Case(
        "-Inf in pcm_f32le", (struct.pack("<f", float("-inf")),), "bad_message", 4400, "/v1/listen?encoding=pcm_f32le"
    ),
    Case("unsupported sample rate", (), "unsupported_audio", 4415, "/v1/listen?sample_rate=96000"),
    Case("sample rate zero", (), "unsupported_audio", 4415, "/v1/listen?sample_rate=0"),
    Case("sample rate not a number", (), "unsupported_audio", 4415, "/v1/listen?sample_rate=fast"),
    Case("unsupported encoding", (), "unsupported_audio", 4415, "/v1/listen?encoding=mp3"),
    Case("three channels", (), "unsupported_audio", 4415, "/v1/listen?channels=3"),
    Case("unknown parameter", (), "unsupported_audio", 4415, "/v1/listen?bitrate=5"),
    Case("parameter twice", (), "unsupported_audio", 4415, "/v1/listen?channels=1&channels=2"),
    Case("bad language", (), "unsupported_audio", 4415, "/v1/listen?language=english"),
    Case("malformed resume id", (), "unsupported_audio", 4415, "/v1/listen?resume=a%2Fb"),
    Case("negative last_seq", (), "unsupported_audio", 4415, "/v1/listen?resume=abc&last_seq=-1"),
    Case("unknown session to resume", (), "unknown_session", 4404, "/v1/listen?resume=abcdef&last_seq=0"),
    # not errors, by design (docs/protocol.md): what the server does is still defined and accounted
    Case("odd PCM16 length at the end", (b"\0" * 3201, END), None, 1000),
    Case("audio after end is ignored", (b"\0" * 3200, END, b"\0" * 3200), None, 1000),
    Case("empty binary frame", (b"", END), None, 1000),
    Case("half a stereo frame at the end", (b"\0" * 6, END), None, 1000, "/v1/listen?channels=2"),
]


def twilio_start(call_sid: str, encoding: str = "audio/x-mulaw") -> str:
    start = {
        "streamSid": "MZ1",
        "callSid": call_sid,
        "accountSid": "AC1",
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": encoding, "sampleRate": 8000, "channels": 1},
    }
    return json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": start})


def twilio_media(payload: str) -> str:
    media = {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": payload}
    return json.dumps({"event": "media", "sequenceNumber": "2", "streamSid": "MZ1", "media": media})


# Twilio gets no messages back (Media Streams are one-way): only the close code tells
TWILIO = [
    Case("Twilio: binary frame", (b'{"event":"connected"}',), None, 4400, "/twilio"),
    Case("Twilio: not JSON", ("{",), None, 4400, "/twilio"),
    Case("Twilio: no event", ('{"sequenceNumber":"1"}',), None, 4400, "/twilio"),
    Case("Twilio: media before start", (twilio_media("AAAA"),), None, 4400, "/twilio"),
    Case("Twilio: invalid base64", (twilio_start("CA2"), twilio_media("!!not base64!!")), None, 4400, "/twilio"),
    Case("Twilio: huge message", (twilio_start("CA3"), twilio_media("A" * MAX_MESSAGE_CHARS)), None, 4400, "/twilio"),
    Case("Twilio: wrong media format", (twilio_start("CA4", "audio/x-l16"),), None, 4415, "/twilio"),
    Case("Twilio: a call that already ended", (twilio_start("CA2"),), None, 4400, "/twilio"),
    Case("Twilio: sequenceNumber not a number", ('{"event":"connected","sequenceNumber":"x"}',), None, 4400, "/twilio"),
]


def realtime_append(audio: str) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


# (name, frame, error code): the Realtime API answers an error event and goes on
REALTIME = [
    ("binary frame", b"\0\1\2", "invalid_json"),
    ("not JSON", "{", "invalid_json"),
    ("no type", "{}", "invalid_value"),
    ("unknown event type", '{"type":"response.create"}', "unknown_event"),
    ("audio not a string", '{"type":"input_audio_buffer.append","audio":5}', "invalid_value"),
    ("invalid base64", realtime_append("***"), "invalid_value"),
    ("huge event", realtime_append("A" * (2 * MAX_APPEND_BYTES)), "invalid_json"),
    ("base64 just over the append limit", realtime_append("AAAA" * (MAX_APPEND_BYTES // 3 + 2)), "invalid_value"),
    ("session not an object", '{"type":"session.update","session":[]}', "invalid_value"),
    ("unsupported format", '{"type":"transcription_session.update","session":{"input_audio_format":"opus"}}', None),
]


async def run_case(port: int, case: Case) -> str | None:
    messages: list[dict[str, Any]] = []
    async with ws_connect(f"ws://127.0.0.1:{port}{case.path}", max_queue=None, max_size=None) as ws:
        try:
            async with asyncio.timeout(HANG_SECONDS):
                for frame in case.frames:
                    await ws.send(frame)
                if case.path == "/twilio" and case.code is None and case.close_code == 1000:
                    await ws.send('{"event":"stop"}')
                async for message in ws:
                    messages.append(json.loads(message))
        except ConnectionClosed:
            pass
        except TimeoutError:
            return f"{case.name}: no close at all"
    if ws.close_code != case.close_code:
        return f"{case.name}: close {ws.close_code}, expected {case.close_code}; last {messages[-1:]}"
    if case.path.startswith("/v1/listen"):
        last = messages[-1] if messages else {}
        if case.code is None:
            if last.get("type") != "done":
                return f"{case.name}: ended with {last}, expected done"
            received = last["audio_seconds_received"]
            accounted = last["audio_seconds_transcribed"] + last["non_speech_seconds"] + last["lost_seconds"]
            if abs(received - accounted) > 1e-4:
                return f"{case.name}: {received} s received, {accounted} s accounted"
        elif last.get("type") != "error" or last.get("code") != case.code:
            return f"{case.name}: ended with {last}, expected error {case.code}"
    return None


async def run_realtime(port: int, name: str, frame: str | bytes, code: str | None) -> str | None:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription", max_size=None) as ws:
        created = json.loads(await ws.recv())
        assert created["type"].endswith("session.created")
        await ws.send(frame)
        answer = json.loads(await asyncio.wait_for(ws.recv(), HANG_SECONDS))
        if answer["type"] != "error" or (code is not None and answer["error"]["code"] != code):
            return f"Realtime {name}: answered {answer}, expected error {code}"
        # the session goes on: a good event still works
        await ws.send('{"type":"input_audio_buffer.clear"}')
        cleared = json.loads(await asyncio.wait_for(ws.recv(), HANG_SECONDS))
        if cleared["type"] != "input_audio_buffer.cleared":
            return f"Realtime {name}: the session did not go on ({cleared})"
    return None


async def test_malformed_input_gets_an_error_and_its_close_code_beside_a_healthy_stream() -> None:
    # a Twilio call ends with its stream (no grace period): "a call that already ended" is one at once
    centre = CallCentreOptions(twilio=TwilioOptions(call_end_grace=0.0))
    config = ServerConfig(port=0, session=replace(SessionOptions(), max_frame_bytes=MAX_FRAME))
    async with App(config, ScriptedEngine(LONG_WORDS), call_centre=centre) as srv:
        healthy = asyncio.create_task(stream(srv.port, looped_speech(20.0), speed=4.0))
        problems = [await run_case(srv.port, case) for case in [*LISTEN, *TWILIO]]
        problems += [await run_realtime(srv.port, *case) for case in REALTIME]
        outcome = await healthy
        # every refused session lets go of its slot (until fails after its hang guard otherwise)
        await until(lambda: srv.scheduler is not None and srv.scheduler.active_sessions == 0)
    tried = len(LISTEN) + len(TWILIO) + len(REALTIME)
    TALLY["malformed inputs tried"] += tried
    assert tried >= 25
    assert [p for p in problems if p] == []
    assert outcome.close_code == 1000 and outcome.seqs_in_order() and outcome.unaccounted_samples() == 0
    TALLY["samples unaccounted"] += outcome.unaccounted_samples()
