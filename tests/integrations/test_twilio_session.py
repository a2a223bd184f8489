"""/twilio end to end: the scripted engine for the mechanics, tiny.en for real telephony speech."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamer.core.audio import resample
from streamer.core.stream import CoreOptions
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.integrations.endpoints import IntegrationOptions
from streamer.integrations.hub import CallEvent, CallHub
from streamer.integrations.pipeline import Phase
from streamer.integrations.twilio import TrackName, recorded_messages, twilio_signature
from streamer.integrations.twilio_session import TwilioOptions, TwilioSession
from streamer.server.adapter import Close
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from tests.helpers import WORDS, FakeClock, pump, until

TOKEN = "twilio-auth-token-for-tests"


def voice_8k(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    n = int(seconds * 16000)
    audio = np.concatenate([synthetic_voice(n, seed), synthetic_silence(16000)])
    return resample(audio, 16000, 8000)


def config(twilio: TwilioOptions | None = None, **kw: Any) -> ServerConfig:
    return ServerConfig(port=0, integrations=IntegrationOptions(twilio=twilio or TwilioOptions(), **kw))


async def follow(port: int, call_sid: str) -> list[dict[str, Any]]:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/calls/{call_sid}/events") as ws:
        return [json.loads(m) async for m in ws]


async def following(srv: Server, call_sid: str) -> asyncio.Future[list[dict[str, Any]]]:
    """A follower of ``call_sid``, returned once the server has subscribed it: it will see every live event."""
    follower = asyncio.ensure_future(follow(srv.port, call_sid))
    await until(lambda: srv.integrations.hub.subscribers(call_sid) == 1 or follower.done())
    return follower


async def stream(
    port: int, messages: Iterable[Mapping[str, Any]], headers: Mapping[str, str] | None = None
) -> int | None:
    async with ws_connect(f"ws://127.0.0.1:{port}/twilio", additional_headers=headers) as ws:
        for message in messages:
            await ws.send(json.dumps(message))
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
        return ws.close_code


# -- the adapter alone: Twilio's messages and `now` in, the call's events to the hub and a close out ------------------


class Call:
    """A Twilio adapter over a scheduler the test runs by hand (:func:`tests.helpers.pump`), its hub recorded."""

    def __init__(self, options: TwilioOptions | None = None) -> None:
        self.engine = ScriptedEngine(WORDS)
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.hub = CallHub()
        self.published: list[CallEvent] = []
        self.hub.add_listener(self.published.append)
        self.adapter = TwilioSession(self.scheduler, CoreOptions(), options or TwilioOptions(), self.hub, now=0.0)

    def send(self, messages: Iterable[Mapping[str, Any]], now: float = 0.0) -> None:
        for message in messages:
            self.adapter.receive_text(json.dumps(message), now)
            pump(self.scheduler, self.engine)

    def types(self) -> list[str]:
        return [e.type.value for e in self.published]


def test_the_adapter_publishes_the_call_and_closes_1000_after_stop() -> None:
    call = Call()
    call.send(recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CA1"))
    assert call.adapter.phase is Phase.CLOSED and not call.adapter.reading
    assert call.adapter.close_action() == Close(1000, "stopped")
    types = call.types()
    assert types[0] == "call_started" and types[-1] == "call_ended" and "final" in types
    assert call.published[-1].data is not None and call.published[-1].data["reason"] == "stopped"
    assert call.adapter.messages_to_send(1.0) == []  # a Media Stream is one-way
    call.adapter.release()
    assert call.scheduler.next_batch() is None


def test_after_stop_the_adapter_waits_for_the_last_finals_at_most_flush_timeout() -> None:
    call = Call(TwilioOptions(flush_timeout=20.0))
    messages = list(recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CA1"))
    for message in messages:  # nobody decodes: the finals cannot come
        call.adapter.receive_text(json.dumps(message), 5.0)
    assert call.adapter.phase is Phase.DRAINING and call.adapter.next_deadline() == 25.0
    call.adapter.receive_timer(24.0)
    assert call.adapter.close_action() is None
    call.adapter.receive_timer(25.0)
    assert call.adapter.close_action() == Close(1000, "stopped") and call.types()[-1] == "call_ended"


def test_a_silent_stream_is_closed_4408_after_the_idle_timeout() -> None:
    call = Call(TwilioOptions(idle_timeout=10.0))
    call.adapter.receive_text(json.dumps({"event": "connected"}), 3.0)
    assert call.adapter.next_deadline() == 13.0
    call.adapter.receive_timer(13.0)
    assert call.adapter.close_action() == Close(4408, "idle_timeout")
    assert call.published == []  # no call started: nothing to end


@pytest.mark.parametrize(
    ("frame", "code"),
    [(b"\0", (4400, "bad_message")), ("[]", (4400, "bad_message")), ('{"event": 1}', (4400, "bad_message"))],
)
def test_a_malformed_message_closes_4400(frame: str | bytes, code: tuple[int, str]) -> None:
    call = Call()
    if isinstance(frame, bytes):
        call.adapter.receive_bytes(frame, 1.0)
    else:
        call.adapter.receive_text(frame, 1.0)
    assert call.adapter.close_action() == Close(*code)


def test_a_hang_up_ends_the_call_like_stop_and_shutdown_like_an_error() -> None:
    call = Call()
    messages = list(recorded_messages({TrackName.INBOUND: voice_8k(1.0)}, call_sid="CA1"))
    call.send(messages[:-1])  # no stop
    call.adapter.receive_connection_lost(2.0)
    pump(call.scheduler, call.engine)
    assert call.adapter.close_action() == Close(1000, "stopped")
    other = Call()
    other.send(messages[:-1])
    other.adapter.receive_shutdown(2.0)
    pump(other.scheduler, other.engine)
    assert other.adapter.close_action() == Close(1001, "shutting_down")
    assert other.published[-1].data is not None and other.published[-1].data["reason"] == "shutting_down"


# -- over a real server ---------------------------------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with Server(config(), ScriptedEngine(WORDS)) as srv:
        yield srv


async def test_two_tracks_are_transcribed_separately_and_followed_live(server: Server) -> None:
    follower = await following(server, "CA1")  # subscribed before the call starts
    tracks = {TrackName.INBOUND: voice_8k(3.0), TrackName.OUTBOUND: voice_8k(2.0, seed=1)}
    code = await stream(server.port, recorded_messages(tracks, call_sid="CA1", custom_parameters={"agent": "42"}))
    assert code == 1000
    events = await asyncio.wait_for(follower, 60)
    assert events[0]["type"] == "call_started"
    assert events[0]["data"]["tracks"] == {"inbound": "customer", "outbound": "agent"}
    assert events[0]["data"]["custom_parameters"] == {"agent": "42"}
    assert events[-1]["type"] == "call_ended" and events[-1]["data"]["reason"] == "stopped"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    finals = [e for e in events if e["type"] == "final"]
    assert {(e["track"], e["label"]) for e in finals} == {("inbound", "customer"), ("outbound", "agent")}
    for track, seconds in (("inbound", 3.0), ("outbound", 2.0)):
        mine = [e for e in finals if e["track"] == track]
        words = [w for e in mine for w in e["text"].split()]
        assert words and words == sorted(set(words), key=lambda w: int(w[1:]))  # in order, none twice
        assert max(e["end"] for e in mine) <= seconds + 0.5  # VAD padding reaches into the pause
    assert any(e["type"] == "partial" for e in events)


async def test_missing_media_becomes_silence_and_a_gap_event(server: Server) -> None:
    follower = await following(server, "CAgap")
    audio = voice_8k(2.0)
    messages = recorded_messages({TrackName.INBOUND: audio}, call_sid="CAgap", drop_chunks=frozenset({10, 11, 12}))
    assert await stream(server.port, messages) == 1000
    events = await asyncio.wait_for(follower, 60)
    gaps = [e for e in events if e["type"] == "gap"]
    assert gaps == [gaps[0]] and gaps[0]["start"] == pytest.approx(0.18) and gaps[0]["end"] == pytest.approx(0.24)
    stats = events[-1]["data"]["tracks"]["inbound"]
    assert stats["gaps"] == 1 and stats["gap_samples"] == 480 and stats["missing_sequence_numbers"] == 3
    assert stats["samples"] == len(audio)  # stream time stays true to call time


async def test_late_follower_gets_the_history(server: Server) -> None:
    assert await stream(server.port, recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CAlate")) == 1000
    events = await asyncio.wait_for(follow(server.port, "CAlate"), 60)
    assert next(e["type"] for e in events) == "call_started" and events[-1]["type"] == "call_ended"
    assert {e["type"] for e in events} == {"call_started", "final", "call_ended"}


async def test_follower_may_not_send(server: Server) -> None:
    async with ws_connect(f"ws://127.0.0.1:{server.port}/v1/calls/CAx/events") as ws:
        await ws.send("hello")
        message = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert message["code"] == "bad_message" and ws.close_code == 4400


async def test_malformed_twilio_message_closes_4400(server: Server) -> None:
    frames = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}, call_sid="CAbad"))[:4]
    assert await stream(server.port, [*frames, {"event": "media", "media": {"timestamp": "x", "payload": ""}}]) == 4400


async def test_wrong_media_format_closes_4415(server: Server) -> None:
    frames = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}))
    frames[1]["start"]["mediaFormat"]["encoding"] = "audio/l16"
    assert await stream(server.port, frames[:3]) == 4415


async def test_signature_is_required_when_a_token_is_configured() -> None:
    async with Server(config(TwilioOptions(auth_token=TOKEN)), ScriptedEngine(WORDS)) as srv:
        messages = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}, call_sid="CAsig"))
        for headers in ({}, {"X-Twilio-Signature": "AAAA"}, {"X-Twilio-Signature": twilio_signature("x", "wss://a/")}):
            with pytest.raises(InvalidStatus) as refused:
                await stream(srv.port, messages, headers)
            assert refused.value.response.status_code == 403
        url = f"wss://127.0.0.1:{srv.port}/twilio"  # what Twilio signs: the wss URL it was told to open
        assert await stream(srv.port, messages, {"X-Twilio-Signature": twilio_signature(TOKEN, url)}) == 1000


async def test_public_url_is_what_is_signed() -> None:
    options = TwilioOptions(auth_token=TOKEN, public_url="wss://calls.example.com")
    async with Server(config(options), ScriptedEngine(WORDS)) as srv:
        messages = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}))
        signature = twilio_signature(TOKEN, "wss://calls.example.com/twilio")
        assert await stream(srv.port, messages, {"X-Twilio-Signature": signature}) == 1000


async def test_finals_reach_the_transcripts_dir(tmp_path: Path) -> None:
    from streamer.integrations.delivery import DeliveryOptions

    cfg = config(delivery=DeliveryOptions(jsonl_dir=tmp_path))
    async with Server(cfg, ScriptedEngine(WORDS)) as srv:
        assert await stream(srv.port, recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CAj")) == 1000
    lines = [json.loads(line) for line in (tmp_path / "CAj.jsonl").read_text().splitlines()]
    assert lines[-1]["type"] == "call_ended" and all(line["type"] == "final" for line in lines[:-1]) and lines[:-1]


# ---------------------------------------------------------------------------------------------------------------------
# Real speech, real model


def telephony(shared: Path, name: str, seconds: float) -> npt.NDArray[np.float32]:
    import soundfile as sf

    audio, rate = sf.read(shared / "telephony" / name, dtype="float32")
    assert rate == 8000
    return np.asarray(audio[: int(seconds * rate)], dtype=np.float32)


@pytest.mark.model
async def test_replayed_call_gives_per_track_transcripts_seen_live(shared_data: Path, tiny_engine: Any) -> None:
    from streamer.offline.normalize import normalize_english, word_error_rate

    customer = telephony(shared_data, "OSR_us_000_0010_8k.wav", 10.0)
    agent = telephony(shared_data, "OSR_us_000_0011_8k.wav", 10.0)
    # the first three Harvard sentences of each file (they take the first ten seconds)
    references = {
        "inbound": "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
        "It's easy to tell the depth of a well.",
        "outbound": "The boy was there when the sun rose. A rod is used to catch pink salmon. "
        "The source of the huge river is the clear spring.",
    }
    async with Server(ServerConfig(port=0), tiny_engine) as srv:
        follower = await following(srv, "CAreal")
        tracks = {TrackName.INBOUND: customer, TrackName.OUTBOUND: agent}
        assert await stream(srv.port, recorded_messages(tracks, call_sid="CAreal")) == 1000
        events = await asyncio.wait_for(follower, 120)
    for track, reference in references.items():
        text = " ".join(e["text"] for e in events if e["type"] == "final" and e["track"] == track)
        wer = word_error_rate([normalize_english(reference)], [normalize_english(text)]).wer
        assert wer < 0.35, (track, text)
    # the agent's words never leak into the customer's transcript, nor the reverse
    inbound = " ".join(e["text"] for e in events if e["type"] == "final" and e["track"] == "inbound").lower()
    assert (
        "salmon" not in inbound
        and "birch"
        not in " ".join(e["text"] for e in events if e["type"] == "final" and e["track"] == "outbound").lower()
    )


def test_options_are_validated() -> None:
    from streamer.core.errors import ConfigError

    for bad in (
        TwilioOptions(auth_token=""),
        TwilioOptions(public_url="calls.example.com"),
        TwilioOptions(idle_timeout=0),
    ):
        with pytest.raises(ConfigError):
            bad.validate()
    assert replace(TwilioOptions(), auth_token="x").auth_token == "x"


async def test_replay_tool_plays_a_stereo_file_as_a_two_track_call(tmp_path: Path) -> None:
    import soundfile as sf

    from streamer.cli.twilio_replay import load_tracks, replay

    left = np.concatenate([synthetic_voice(32000), synthetic_silence(16000)])
    right = np.concatenate([synthetic_silence(8000), synthetic_voice(24000, seed=3), synthetic_silence(16000)])
    path = tmp_path / "call.wav"
    sf.write(path, np.stack([left, right], axis=1), 16000)
    tracks = load_tracks(path, stereo=True)
    assert set(tracks) == {TrackName.INBOUND, TrackName.OUTBOUND} and len(tracks[TrackName.INBOUND]) == 24000
    async with Server(config(TwilioOptions(auth_token=TOKEN)), ScriptedEngine(WORDS)) as srv:
        follower = await following(srv, "CAreplay")
        url = f"ws://127.0.0.1:{srv.port}/twilio"
        signature = {"X-Twilio-Signature": twilio_signature(TOKEN, url.replace("ws://", "wss://"))}
        clock = FakeClock()
        code = await replay(
            url, tracks, call_sid="CAreplay", speed=10.0, headers=signature, clock=clock, sleep=clock.sleep
        )
        assert code == 1000
        # paced: 3 s of audio in 20 ms chunks at 10x, the last chunk (at 2.98 s) sent 0.298 s after the first
        assert clock() == pytest.approx(0.298)
        assert len(clock.sleeps) == 149 and all(s == pytest.approx(0.002) for s in clock.sleeps)
        events = await asyncio.wait_for(follower, 60)
    assert {e["track"] for e in events if e["type"] == "final"} == {"inbound", "outbound"}
