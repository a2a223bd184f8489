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

from streamer.app import App
from streamer.core.audio import resample
from streamer.core.options import CoreOptions
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.engine.types import Engine
from streamer.integrations.call_centre import CallCentreOptions
from streamer.integrations.hub import CallEvent, CallHub
from streamer.integrations.twilio import TrackName, recorded_messages, twilio_signature
from streamer.integrations.twilio_calls import TwilioCalls
from streamer.integrations.twilio_session import TwilioOptions, TwilioSession
from streamer.server.adapter import Close
from streamer.server.lifecycle import Phase
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from tests.helpers import WORDS, FakeClock, ManualTimers, pump, until

TOKEN = "twilio-auth-token-for-tests"


def voice_8k(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    n = int(seconds * 16000)
    audio = np.concatenate([synthetic_voice(n, seed), synthetic_silence(16000)])
    return resample(audio, 16000, 8000)


def app(engine: Engine, twilio: TwilioOptions | None = None, **kw: Any) -> App:
    """A server whose calls end with their last stream (no grace period), unless ``twilio`` says otherwise."""
    twilio = twilio or TwilioOptions(call_end_grace=0.0)
    return App(ServerConfig(port=0), engine, call_centre=CallCentreOptions(twilio=twilio, **kw))


async def follow(port: int, call_sid: str) -> list[dict[str, Any]]:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/calls/{call_sid}/events") as ws:
        return [json.loads(m) async for m in ws]


async def following(srv: Server, call_sid: str) -> asyncio.Future[list[dict[str, Any]]]:
    """A follower of ``call_sid``, returned once the server has subscribed it: it will see every live event."""
    follower = asyncio.ensure_future(follow(srv.port, call_sid))
    await until(lambda: srv.call_centre.hub.subscribers(call_sid) == 1 or follower.done())
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
    """Twilio adapters over a scheduler the test runs by hand (:func:`tests.helpers.pump`), their hub recorded, and
    the calls' grace periods ending when the test moves :attr:`timers`. :attr:`adapter` is the first stream; each
    :meth:`stream` opens another connection."""

    def __init__(self, options: TwilioOptions | None = None) -> None:
        self.options = options or TwilioOptions(call_end_grace=0.0)
        self.engine = ScriptedEngine(WORDS)
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.hub = CallHub()
        self.published: list[CallEvent] = []
        self.hub.add_listener(self.published.append)
        self.timers = ManualTimers()
        self.calls = TwilioCalls(self.hub, self.options.call_end_grace, self.timers.call_later)
        self.adapter = self.stream()

    def stream(self, now: float = 0.0) -> TwilioSession:
        return TwilioSession(self.scheduler, CoreOptions(), self.options, self.calls, now=now)

    def send(
        self, messages: Iterable[Mapping[str, Any]], now: float = 0.0, adapter: TwilioSession | None = None
    ) -> None:
        for message in messages:
            (adapter or self.adapter).receive_text(json.dumps(message), now)
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
    call = Call(TwilioOptions(flush_timeout=20.0, call_end_grace=0.0))
    messages = list(recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CA1"))
    for message in messages:  # nobody decodes: the finals cannot come
        call.adapter.receive_text(json.dumps(message), 5.0)
    assert call.adapter.phase is Phase.DRAINING and call.adapter.next_deadline() == 25.0
    call.adapter.receive_timer(24.0)
    assert call.adapter.close_action() is None
    call.adapter.receive_timer(25.0)
    assert call.adapter.close_action() == Close(1000, "stopped") and call.types()[-1] == "call_ended"
    # what the engine did not finish is named to the call's followers: a gap over everything the track received
    [gap] = [e for e in call.published if e.type.value == "gap"]
    assert call.adapter.transcriber is not None
    received = call.adapter.transcriber.track("inbound").core.samples_received / 16000
    assert received >= 2.0 and (gap.start, gap.end) == pytest.approx((0.0, received), abs=1e-3)
    assert gap.data == {"reason": "engine_failure"}


def test_a_silent_stream_is_closed_4408_after_the_idle_timeout() -> None:
    call = Call(TwilioOptions(idle_timeout=10.0, call_end_grace=0.0))
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


# -- several streams of one call ------------------------------------------------------------------------------------


def stream_messages(
    track: TrackName, seconds: float, call_sid: str, stream_sid: str, seed: int = 0, **kw: Any
) -> list[dict[str, Any]]:
    return list(recorded_messages({track: voice_8k(seconds, seed)}, call_sid=call_sid, stream_sid=stream_sid, **kw))


def by_type(events: list[CallEvent], kind: str) -> list[CallEvent]:
    return [e for e in events if e.type.value == kind]


def test_one_stream_per_track_merges_into_one_call_that_ends_after_the_last_and_the_grace() -> None:
    call = Call(TwilioOptions(call_end_grace=5.0))
    inbound = stream_messages(TrackName.INBOUND, 3.0, "CA2", "MZin")
    outbound = stream_messages(TrackName.OUTBOUND, 2.0, "CA2", "MZout", seed=1)
    second = call.stream()
    # Twilio sends both streams at once, each on its own connection: interleave their messages
    for a, b in zip(inbound, outbound + [None] * (len(inbound) - len(outbound)), strict=True):
        call.send([a], now=1.0)
        if b is not None and b["event"] != "stop":
            call.send([b], now=1.0, adapter=second)
    call.send([outbound[-1]], now=4.0, adapter=second)  # the outbound stream stopped first
    assert call.types().count("call_started") == 1 and call.types().count("stream_started") == 2
    assert call.types()[-1] == "stream_ended" and call.adapter.close_action() == second.close_action() == Close(
        1000, "stopped"
    )
    call.timers.advance(4.9)
    assert "call_ended" not in call.types()  # the call waits for another stream
    call.timers.advance(0.1)
    types = call.types()
    assert types[-1] == "call_ended" and types.count("call_ended") == 1
    assert [e.seq for e in call.published] == list(range(1, len(call.published) + 1))  # one sequence per call
    finals = by_type(call.published, "final")
    assert {(e.track, e.label) for e in finals} == {("inbound", "customer"), ("outbound", "agent")}
    ended = call.published[-1].data
    assert ended is not None and ended["streams"] == ["MZin", "MZout"] and ended["reason"] == "stopped"
    assert ended["tracks"]["inbound"]["samples"] == len(voice_8k(3.0))
    assert ended["tracks"]["outbound"]["samples"] == len(voice_8k(2.0))
    assert call.scheduler.next_batch() is None


def test_a_stream_restarted_after_stop_continues_the_call_with_new_segment_ids_on_the_call_s_clock() -> None:
    call = Call(TwilioOptions(call_end_grace=5.0))
    # the first stream starts at 10 s on the server's clock and carries 4 s of media (3 s of voice, 1 s of pause)
    call.send(stream_messages(TrackName.INBOUND, 3.0, "CA3", "MZ1"), now=10.0)
    first = by_type(call.published, "final")
    assert first and call.types()[-1] == "stream_ended"
    call.timers.advance(2.0)  # <Stop><Stream> at 14 s, then <Start><Stream> two seconds later
    restarted = call.stream(now=16.0)
    messages = stream_messages(TrackName.INBOUND, 3.0, "CA3", "MZ2", seed=2)
    call.send(messages[:2], now=16.0, adapter=restarted)
    call.timers.advance(5.0)  # past the first stream's grace: the call is live again, so it does not end
    call.send(messages[2:], now=20.0, adapter=restarted)
    assert call.types().count("call_ended") == 0 and call.types().count("call_started") == 1
    call.timers.advance(5.0)
    assert call.types()[-1] == "call_ended"
    second = by_type(call.published, "final")[len(first) :]
    assert second
    # segment ids stay unique on the track over the whole call, and the second stream's times follow the first's
    ids = [e.segment_id for e in by_type(call.published, "final")]
    assert len(ids) == len(set(ids)) and min(e.segment_id or 0 for e in second) > max(e.segment_id or 0 for e in first)
    restart = by_type(call.published, "stream_started")[1]
    assert restart.data is not None and restart.data["offset"] == 6.0
    assert min(e.start or 0 for e in second) >= 6.0 > max(e.end or 0 for e in first)
    ended = call.published[-1].data
    assert ended is not None and ended["streams"] == ["MZ1", "MZ2"]
    assert ended["tracks"]["inbound"]["samples"] == 2 * len(voice_8k(3.0))  # summed over the streams


def test_the_same_track_twice_at_once_is_refused_with_track_in_use_and_the_first_stream_goes_on() -> None:
    call = Call(TwilioOptions(call_end_grace=0.0))
    first = stream_messages(TrackName.INBOUND, 2.0, "CA4", "MZa")
    call.send(first[:20], now=1.0)
    intruder = call.stream(now=1.0)
    call.send(stream_messages(TrackName.INBOUND, 1.0, "CA4", "MZb")[:3], now=1.0, adapter=intruder)
    assert intruder.close_action() == Close(4409, "track_in_use")
    assert [e.type.value for e in call.published].count("stream_started") == 1  # the refused stream said nothing
    call.send(first[20:], now=2.0)
    assert call.adapter.close_action() == Close(1000, "stopped") and call.types()[-1] == "call_ended"
    assert by_type(call.published, "final")
    # the same streamSid twice at once is refused too (it would carry the same tracks)
    again = Call()
    again.send(stream_messages(TrackName.INBOUND, 1.0, "CA5", "MZa")[:5])
    duplicate = again.stream()
    again.send(stream_messages(TrackName.OUTBOUND, 1.0, "CA5", "MZa")[:3], adapter=duplicate)
    assert duplicate.close_action() == Close(4400, "bad_message")


def test_once_the_grace_period_is_over_the_call_has_ended_and_cannot_stream_again() -> None:
    call = Call(TwilioOptions(call_end_grace=1.0))
    call.send(stream_messages(TrackName.INBOUND, 1.0, "CA6", "MZ1"))
    call.timers.advance(1.0)
    assert call.types()[-1] == "call_ended"
    late = call.stream(now=5.0)
    call.send(stream_messages(TrackName.INBOUND, 1.0, "CA6", "MZ2")[:3], now=5.0, adapter=late)
    assert late.close_action() == Close(4400, "bad_message") and call.types()[-1] == "call_ended"


def test_a_stream_ended_by_shutdown_ends_its_call_at_once_and_close_ends_the_waiting_ones() -> None:
    call = Call(TwilioOptions(call_end_grace=30.0))
    call.send(stream_messages(TrackName.INBOUND, 1.0, "CA7", "MZ1")[:-1])
    call.adapter.receive_shutdown(2.0)
    pump(call.scheduler, call.engine)
    assert call.types()[-1] == "call_ended" and call.published[-1].data == {
        "reason": "shutting_down",
        "tracks": {"inbound": call.published[-2].data["tracks"]["inbound"]},  # type: ignore[index]
        "streams": ["MZ1"],
    }
    waiting = Call(TwilioOptions(call_end_grace=30.0))
    waiting.send(stream_messages(TrackName.INBOUND, 1.0, "CA8", "MZ1"))
    assert waiting.types()[-1] == "stream_ended"
    waiting.calls.close()  # the server stops: no stream can come
    assert waiting.types()[-1] == "call_ended" and "CA8" not in waiting.calls


def test_a_stream_released_before_its_story_ended_still_ends_in_its_call() -> None:
    call = Call()
    call.send(stream_messages(TrackName.INBOUND, 1.0, "CA12", "MZ1")[:10])
    call.adapter.release()  # what the runner does when its task is cancelled mid-stream
    assert call.types()[-2:] == ["stream_ended", "call_ended"] and "CA12" not in call.calls
    assert call.scheduler.next_batch() is None


def test_dtmf_and_mark_are_published_where_the_stream_is() -> None:
    call = Call()
    messages = stream_messages(TrackName.INBOUND, 1.0, "CA9", "MZ1", dtmf={10: "4", 30: "#"})
    mark = {"event": "mark", "sequenceNumber": "999", "streamSid": "MZ1", "mark": {"name": "greeting played"}}
    call.send([*messages[:-1], mark, messages[-1]])
    keys = by_type(call.published, "dtmf")
    assert [(e.track, e.label, e.start, e.data) for e in keys] == [
        ("inbound", "customer", 0.2, {"digit": "4"}),  # after the 10th chunk of 20 ms
        ("inbound", "customer", 0.6, {"digit": "#"}),
    ]
    [marked] = by_type(call.published, "mark")
    assert marked.data == {"name": "greeting played"} and marked.track is None
    assert marked.start == pytest.approx(len(voice_8k(1.0)) / 8000, abs=1e-3)
    early = Call()
    early.send([{"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": "1"}}])
    assert early.adapter.close_action() == Close(4400, "bad_message")


def test_labels_given_in_custom_parameters_name_the_tracks_everywhere() -> None:
    call = Call()
    tracks = {TrackName.INBOUND: voice_8k(2.0), TrackName.OUTBOUND: voice_8k(2.0, seed=1)}
    parameters = {"inbound_label": "callee", "outbound_label": "campaign agent"}
    call.send(recorded_messages(tracks, call_sid="CA10", custom_parameters=parameters, dtmf={5: "9"}))
    started = call.published[0].data
    assert started is not None and started["tracks"] == {"inbound": "callee", "outbound": "campaign agent"}
    labelled = [e for e in call.published if e.track is not None]
    assert {(e.track, e.label) for e in labelled} == {("inbound", "callee"), ("outbound", "campaign agent")}
    bad = Call()
    bad.send(recorded_messages(tracks, call_sid="CA11", custom_parameters={"inbound_label": " "}))
    assert bad.adapter.close_action() == Close(4400, "bad_message") and bad.published == []


# -- over a real server ---------------------------------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with app(ScriptedEngine(WORDS)) as srv:
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
    assert {e["type"] for e in events} == {"call_started", "stream_started", "final", "stream_ended", "call_ended"}


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
    async with app(ScriptedEngine(WORDS), TwilioOptions(auth_token=TOKEN, call_end_grace=0.0)) as srv:
        messages = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}, call_sid="CAsig"))
        for headers in ({}, {"X-Twilio-Signature": "AAAA"}, {"X-Twilio-Signature": twilio_signature("x", "wss://a/")}):
            with pytest.raises(InvalidStatus) as refused:
                await stream(srv.port, messages, headers)
            assert refused.value.response.status_code == 403
        url = f"wss://127.0.0.1:{srv.port}/twilio"  # what Twilio signs: the wss URL it was told to open
        assert await stream(srv.port, messages, {"X-Twilio-Signature": twilio_signature(TOKEN, url)}) == 1000


async def test_public_url_is_what_is_signed() -> None:
    options = TwilioOptions(auth_token=TOKEN, public_url="wss://calls.example.com", call_end_grace=0.0)
    async with app(ScriptedEngine(WORDS), options) as srv:
        messages = list(recorded_messages({TrackName.INBOUND: voice_8k(0.5)}))
        signature = twilio_signature(TOKEN, "wss://calls.example.com/twilio")
        assert await stream(srv.port, messages, {"X-Twilio-Signature": signature}) == 1000


async def test_finals_and_keys_reach_the_transcripts_dir(tmp_path: Path) -> None:
    from streamer.integrations.delivery import DeliveryOptions

    async with app(ScriptedEngine(WORDS), delivery=DeliveryOptions(jsonl_dir=tmp_path)) as srv:
        call = recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CAj", dtmf={25: "0"})
        assert await stream(srv.port, call) == 1000
    lines = [json.loads(line) for line in (tmp_path / "CAj.jsonl").read_text().splitlines()]
    assert lines[-1]["type"] == "call_ended" and [line["type"] for line in lines[:-1]].count("final") >= 1
    assert {line["type"] for line in lines[:-1]} == {"final", "dtmf"}
    assert [line["data"] for line in lines if line["type"] == "dtmf"] == [{"digit": "0"}]


async def test_the_replay_command_splits_a_stereo_file_into_two_streams_of_one_call(tmp_path: Path) -> None:
    import argparse

    import soundfile as sf

    from streamer.cli.twilio_replay import _main, configure_parser, run
    from streamer.core.errors import ConfigError

    path = tmp_path / "call.wav"
    sf.write(path, np.stack([voice_8k(1.0), voice_8k(1.0, seed=1)], axis=1), 8000)
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    with pytest.raises(ConfigError, match="--split-tracks needs --stereo"):
        run(parser.parse_args([str(path), "--split-tracks"]))
    # a grace period longer than any skew between the two connections: the call waits for both, whichever stream
    # starts or ends first; the test then ends it as a server stop would
    async with app(ScriptedEngine(WORDS), TwilioOptions(call_end_grace=600.0)) as srv:
        follower = await following(srv, "CAcli")
        url = f"ws://127.0.0.1:{srv.port}/twilio"
        argv = [str(path), "--url", url, "--stereo", "--split-tracks", "--speed", "0", "--call-sid", "CAcli"]
        assert await _main(parser.parse_args([*argv, "--quiet"])) == 0
        assert "CAcli" in srv.call_centre.calls  # both streams ended, the call waits for another
        srv.call_centre.calls.close()
        events = await asyncio.wait_for(follower, 60)
    started = [e["data"] for e in events if e["type"] == "stream_started"]
    assert sorted(tuple(d["tracks"]) for d in started) == [("inbound",), ("outbound",)]
    assert len({d["stream_sid"] for d in started}) == 2 and events[-1]["type"] == "call_ended"


async def test_a_call_streamed_one_track_per_connection_is_followed_as_one_call() -> None:
    """Two <Stream>s of one call, one track each, replayed at once by the replay tool: one call for followers."""
    from streamer.cli.twilio_replay import replay

    async with app(ScriptedEngine(WORDS), TwilioOptions(call_end_grace=600.0)) as srv:
        follower = await following(srv, "CAsplit")
        url = f"ws://127.0.0.1:{srv.port}/twilio"
        customer, agent = voice_8k(3.0), voice_8k(2.0, seed=1)
        codes = await asyncio.gather(
            replay(url, {TrackName.INBOUND: customer}, call_sid="CAsplit", speed=0),
            replay(url, {TrackName.OUTBOUND: agent}, call_sid="CAsplit", speed=0),
        )
        assert codes == [1000, 1000]
        # both streams ended (each before its close reached the client): the call waits out its grace period
        assert "CAsplit" in srv.call_centre.calls
        srv.call_centre.calls.close()  # as a server stop ends it
        events = await asyncio.wait_for(follower, 60)
    types = [e["type"] for e in events]
    assert types[0] == "call_started" and types.count("stream_started") == 2 and types.count("stream_ended") == 2
    assert types[-1] == "call_ended" and types.count("call_ended") == 1
    assert types.index("call_ended") > max(i for i, t in enumerate(types) if t == "stream_ended")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    finals = [e for e in events if e["type"] == "final"]
    assert {(e["track"], e["label"]) for e in finals} == {("inbound", "customer"), ("outbound", "agent")}
    stats = events[-1]["data"]["tracks"]
    assert stats["inbound"]["samples"] == len(customer) and stats["outbound"]["samples"] == len(agent)
    assert len(set(events[-1]["data"]["streams"])) == 2


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
    async with app(tiny_engine) as srv:
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
    async with app(ScriptedEngine(WORDS), TwilioOptions(auth_token=TOKEN, call_end_grace=0.0)) as srv:
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
