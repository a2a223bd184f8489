"""The call pipeline (:class:`streamer.integrations.transcriber.Transcriber`): named tracks at the source rate, each
through its own core, sharing one scheduler; events handed back per track, every sample accounted for."""

from __future__ import annotations

import itertools
import logging
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.audio import resample
from streamer.core.errors import IdleTimeout, InvalidState, ProtocolError
from streamer.core.events import Event, Final, Lost, NonSpeech
from streamer.core.options import CoreOptions
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice, words_from_text
from streamer.engine.types import StreamId
from streamer.integrations.transcriber import Transcriber, TranscribingAdapter
from streamer.server.adapter import session_log
from streamer.server.lifecycle import Phase, StreamLimits
from streamer.server.scheduler import Scheduler, SchedulerOptions
from tests.helpers import until

E = TypeVar("E", bound=Event)

RATE = 8000  # the tracks' rate, as on a phone call
CHUNK = 160  # 20 ms at 8 kHz, as Twilio sends it
# what each track "says": its own words, so that a word on the wrong track shows
SCRIPT = {
    StreamId("call/inbound"): words_from_text(" ".join(f"a{i}" for i in range(40)), 0, 4000, 800),
    StreamId("call/outbound"): words_from_text(" ".join(f"b{i}" for i in range(40)), 0, 4000, 800),
}


def at_8k(*parts: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return resample(np.concatenate(parts), 16000, RATE)


# inbound speaks for 3 s then pauses 1 s; outbound pauses 1 s, speaks 2 s, pauses 1 s
INBOUND = at_8k(synthetic_voice(48000), synthetic_silence(16000))
OUTBOUND = at_8k(synthetic_silence(16000), synthetic_voice(32000, seed=1), synthetic_silence(16000))


class Call:
    """A transcriber over a scheduler that the test runs by hand: :meth:`pump` decodes until no window is left."""

    def __init__(self, tracks: tuple[str, ...] = ("inbound", "outbound")) -> None:
        self.engine = ScriptedEngine(SCRIPT)
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.events: list[tuple[str, Event]] = []
        self.log: list[str] = []  # "event" per on_event call, "after" per after_events call, in order
        self.transcriber = Transcriber(
            self.scheduler, CoreOptions(), "call", tracks, RATE, self._on_event, lambda: self.log.append("after")
        )

    def _on_event(self, track: str, event: Event) -> None:
        self.events.append((track, event))
        self.log.append("event")

    def pump(self) -> None:
        while (batch := self.scheduler.next_batch()) is not None:
            self.scheduler.deliver(batch, self.engine.decode(batch.requests))

    def stream(self, audio: dict[str, npt.NDArray[np.float32]]) -> dict[str, int]:
        """Feed every track 20 ms at a time, interleaved, decoding as it goes; the 16 kHz samples fed per track."""
        fed = dict.fromkeys(audio, 0)
        for offset in range(0, max(len(a) for a in audio.values()), CHUNK):
            for name, samples in audio.items():
                if offset < len(samples):
                    fed[name] += self.transcriber.feed(name, samples[offset : offset + CHUNK], offset / RATE)
            self.pump()
        return fed

    def of(self, track: str, kind: type[E]) -> list[E]:
        return [e for t, e in self.events if t == track and isinstance(e, kind)]

    def words(self, track: str) -> list[str]:
        return [word for e in self.of(track, Final) for word in e.text.split()]


def test_each_track_is_transcribed_apart_from_the_others() -> None:
    call = Call()
    call.stream({"inbound": INBOUND, "outbound": OUTBOUND})
    call.transcriber.end(4.0)
    call.pump()
    inbound, outbound = call.words("inbound"), call.words("outbound")
    # each track's finals hold its own words only, in order, none twice
    assert inbound and all(w.startswith("a") for w in inbound)
    assert outbound and all(w.startswith("b") for w in outbound)
    for words in (inbound, outbound):
        numbers = [int(w[1:]) for w in words]
        assert numbers == sorted(set(numbers))
    # and each final lies where that track spoke: inbound in its first 3 s, outbound from 1 s to 3 s (plus the VAD's
    # padding, 500 ms before and 300 ms after, and a frame)
    assert all(e.end <= 3.5 * 16000 for e in call.of("inbound", Final))
    assert all(e.start >= 0.45 * 16000 and e.end <= 3.5 * 16000 for e in call.of("outbound", Final))
    assert call.of("outbound", NonSpeech)[0] == NonSpeech(0, call.of("outbound", Final)[0].start)


@pytest.mark.parametrize("tracks", [("inbound",), ("inbound", "outbound")])
def test_every_sample_of_every_track_is_accounted_for_once_ended(tracks: tuple[str, ...]) -> None:
    call = Call(tracks)
    audio = {"inbound": INBOUND, "outbound": OUTBOUND}
    fed = call.stream({name: audio[name] for name in tracks})
    # the resampler holds a few milliseconds back until the end
    assert all(0 < 2 * len(audio[name]) - fed[name] <= 0.01 * 16000 for name in tracks)
    call.transcriber.end(4.0)
    call.pump()
    for name in tracks:
        track = call.transcriber.track(name)
        total = 2 * len(audio[name])  # 8 kHz to 16 kHz
        assert track.core.samples_received == total and track.core.done
        # Final, NonSpeech and Lost spans tile [0, total) with no gap and no overlap
        spans = sorted((e.start, e.end) for e in call.of(name, Final) + call.of(name, NonSpeech) + call.of(name, Lost))
        assert spans[0][0] == 0 and spans[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        assert track.accounted == total


def test_finalize_commits_what_one_track_heard_without_waiting_for_a_pause() -> None:
    call = Call()
    voice = at_8k(synthetic_voice(3 * 16000))
    call.stream({"inbound": voice[: 2 * RATE]})  # 2 s of speech and no pause yet
    open_before = len(call.of("inbound", Final))
    call.transcriber.finalize("inbound", 2.0)
    call.pump()
    finals = call.of("inbound", Final)
    assert len(finals) > open_before
    # it ends at the last whole VAD frame received
    received, frame = call.transcriber.track("inbound").core.samples_received, CoreOptions().vad.frame_ms * 16
    assert received - frame < finals[-1].end <= received
    # the track goes on, and the next final starts where that one ended
    call.stream({"inbound": voice[2 * RATE :]})
    call.transcriber.end(3.0)
    call.pump()
    later = call.of("inbound", Final)[len(finals)]
    assert later.start == finals[-1].end
    assert call.of("outbound", Final) == []  # the other track was not touched


def test_after_events_runs_once_the_events_of_a_batch_are_handed_over() -> None:
    call = Call()
    call.stream({"inbound": INBOUND})
    call.transcriber.end(4.0)
    call.pump()
    # each run of events is followed by an after_events call, the last one included
    runs = "".join("e" if entry == "event" else "a" for entry in call.log)
    assert "ea" in runs and runs.endswith("a")


async def test_after_the_end_done_waits_for_the_last_events_of_every_track() -> None:
    call = Call()
    call.scheduler.start()
    try:
        for offset in range(0, len(INBOUND), CHUNK):
            call.transcriber.feed("inbound", INBOUND[offset : offset + CHUNK], offset / RATE)
            call.transcriber.feed("outbound", OUTBOUND[offset : offset + CHUNK], offset / RATE)
        call.transcriber.end(len(INBOUND) / RATE)
        await until(lambda: call.transcriber.done, timeout=60)
    finally:
        await call.scheduler.stop()
        call.transcriber.close()
    for name, audio in (("inbound", INBOUND), ("outbound", OUTBOUND)):
        assert call.transcriber.track(name).accounted == 2 * len(audio)
    assert call.words("inbound") and call.words("outbound")


def test_done_stays_false_while_the_audio_is_not_all_transcribed() -> None:
    call = Call()  # nobody runs the scheduler: the speech is never decoded
    call.transcriber.feed("inbound", INBOUND, 0.0)
    assert not call.transcriber.done  # not ended yet
    call.transcriber.end(1.0)
    assert call.transcriber.done is False
    assert call.of("inbound", Final) == []


async def test_close_unregisters_every_track_and_the_engine_forgets_them() -> None:
    call = Call()
    call.scheduler.start()
    try:
        call.transcriber.close()
        call.transcriber.close()  # idempotent
        await until(lambda: sorted(call.engine.forgotten) == sorted(SCRIPT))
        # speech fed after the close is never scheduled
        call.transcriber.feed("inbound", INBOUND, 0.0)
        assert call.scheduler.next_batch() is None
    finally:
        await call.scheduler.stop()


def test_tracks_are_named_distinct_and_at_least_one() -> None:
    scheduler = Scheduler(ScriptedEngine(SCRIPT), SchedulerOptions())
    for tracks in ((), ("inbound", "inbound")):
        with pytest.raises(InvalidState):
            Transcriber(scheduler, CoreOptions(), "call", tracks, RATE, lambda t, e: None)
    transcriber = Transcriber(scheduler, CoreOptions(), "call", ("inbound", "outbound"), RATE, lambda t, e: None)
    with pytest.raises(InvalidState, match="no track 'agent'; tracks are inbound, outbound"):
        transcriber.feed("agent", INBOUND[:CHUNK], 0.0)


def test_end_is_idempotent() -> None:
    call = Call()
    call.stream({"inbound": INBOUND})
    call.transcriber.end(4.0)
    call.transcriber.end(4.0)  # no second end of stream for the cores (which would raise)
    call.pump()
    assert call.transcriber.track("inbound").accounted == 2 * len(INBOUND)


# -- TranscribingAdapter: the story /twilio and /v1/realtime share -------------------------------------------------


class Story(TranscribingAdapter):
    """Text frames are audio offsets: "speak" feeds a second of speech, "end" ends the stream."""

    def __init__(self, call: Call, now: float) -> None:
        super().__init__(StreamLimits(idle_timeout=10.0, flush_timeout=20.0), now)
        self.id = "story-1"
        self._log = session_log(logging.getLogger("tests.story"), self.id)
        self.call = call
        self.finished: list[ProtocolError | None] = []

    def receive_text(self, frame: str, now: float) -> None:
        if self.phase is not Phase.RECEIVING:
            return
        self._last_frame = now
        if frame == "end":
            self._end(None, now)
            return
        if self.transcriber is None:
            self.transcriber = self.call.transcriber
            self.transcriber.after_events = self._after_events
        self.transcriber.feed("inbound", INBOUND[:RATE], now)

    def receive_bytes(self, frame: bytes, now: float) -> None:
        raise AssertionError("text only")

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self._end(None, now)

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout("idle")

    def _finish(self) -> None:
        self.finished.append(self._error)
        self.phase = Phase.CLOSED
        self._close_with(1000 if self._error is None else self._error.close_code, "bye")


def test_a_transcribing_adapter_ends_once_every_track_is_done() -> None:
    call = Call(("inbound",))
    story = Story(call, now=0.0)
    assert story.reading and story.next_deadline() == 10.0
    story.receive_text("speak", 1.0)
    assert story.next_deadline() == 11.0
    story.receive_text("end", 2.0)
    assert story.phase is Phase.DRAINING and not story.reading and story.next_deadline() == 22.0
    call.pump()  # the last events: the story finishes by itself
    assert story.finished == [None] and story.phase is Phase.CLOSED and story.next_deadline() is None
    assert story.close_action() is not None and story.close_action().code == 1000  # type: ignore[union-attr]
    story.release()
    assert call.scheduler.next_batch() is None


def test_a_transcribing_adapter_gives_up_on_the_last_events_after_flush_timeout() -> None:
    call = Call(("inbound",))
    story = Story(call, now=0.0)
    story.receive_text("speak", 1.0)
    story.receive_shutdown(2.0)  # nobody decodes
    story.receive_timer(21.0)
    assert story.finished == []
    story.receive_timer(22.0)
    assert [type(e).__name__ for e in story.finished] == ["ServerShutdown"]


def test_a_transcribing_adapter_waits_while_the_last_events_keep_coming(caplog: pytest.LogCaptureFixture) -> None:
    # the flush bound watches progress, not the clock alone: a track finished late (a busy engine) buys the other
    # another flush_timeout, and a stretch without any event gives up
    call = Call()
    call.scheduler.options = SchedulerOptions(max_batch_size=1)  # one track's window per decode
    story = Story(call, now=0.0)
    story.transcriber = call.transcriber
    story.transcriber.after_events = story._after_events
    call.transcriber.feed("inbound", INBOUND, 1.0)
    call.transcriber.feed("outbound", OUTBOUND, 1.0)
    story.receive_text("end", 2.0)  # nothing decoded yet
    assert story.next_deadline() == 22.0
    batch = call.scheduler.next_batch()
    assert batch is not None and len(batch.requests) == 1
    call.scheduler.deliver(batch, call.engine.decode(batch.requests))  # one track's last events, late
    story.receive_timer(22.0)
    assert story.finished == [] and story.phase is Phase.DRAINING and story.next_deadline() == 42.0
    story.receive_timer(41.0)
    assert story.finished == []
    with caplog.at_level(logging.WARNING, "tests.story"):
        story.receive_timer(42.0)  # a whole flush_timeout without an event
    assert story.finished == [None] and story.phase is Phase.CLOSED
    assert not call.transcriber.done  # the other track's rest was given up on, and named
    lost = [e for _, e in call.events if isinstance(e, Lost)]
    assert [e.reason for e in lost] == ["the engine did not finish this audio in time"]
    lost_s = (lost[0].end - lost[0].start) / 16000
    assert [r.getMessage() for r in caplog.records] == [
        f"stream=story-1 event=flush_timeout waited_s=40.0 extensions=1 lost_s={lost_s:.2f}"
    ]


def test_a_short_tail_waits_behind_other_calls_for_longer_than_its_length_would_allow() -> None:
    # the ceiling counts at least FLUSH_CEILING_FLOOR_SECONDS left, not the fraction left at the call's end: a busy
    # engine may serve other calls' windows for longer than 10 s per second of that fraction, and the tail is still
    # transcribed
    call = Call(("inbound",))
    call.scheduler.options = SchedulerOptions(max_batch_size=1)  # one window per decode
    other = Transcriber(call.scheduler, CoreOptions(), "other", ("inbound",), RATE, lambda t, e: None, lambda: None)
    story = Story(call, now=0.0)
    story.transcriber = call.transcriber
    story.transcriber.after_events = story._after_events
    call.stream({"inbound": at_8k(synthetic_voice(48000), synthetic_silence(16000), synthetic_voice(8000, seed=2))})
    track = call.transcriber.tracks["inbound"]
    left = (track.core.samples_received - track.accounted) / 16000
    assert call.of("inbound", Final) and 0 < left < 1.5  # the first utterance is final; the short tail is not
    story.receive_text("end", 10.0)
    held = []
    busy = at_8k(*[synthetic_voice(32000, seed=3), synthetic_silence(8000)] * 6)
    for n, look in enumerate((30.0, 50.0, 70.0)):  # a whole flush_timeout (20) between looks
        other.feed("inbound", busy[n * len(busy) // 3 : (n + 1) * len(busy) // 3], look - 1.0)
        while (batch := call.scheduler.next_batch()) is not None:
            if batch.requests[0].stream_id == StreamId("call/inbound"):
                held.append(batch)  # the tail's window, still in the engine's queue
            else:
                call.scheduler.deliver(batch, call.engine.decode(batch.requests))
        story.receive_timer(look)
        assert story.finished == [] and story.phase is Phase.DRAINING, look
    assert held and 10.0 + 20.0 + 10.0 * left < 70.0  # a ceiling on the tail would have given up by now
    for batch in held:
        call.scheduler.deliver(batch, call.engine.decode(batch.requests))
    call.pump()
    assert story.finished == [None] and story.phase is Phase.CLOSED
    assert not call.of("inbound", Lost) and call.transcriber.done
    other.close()


def test_a_shutdown_caps_the_wait_for_the_last_events() -> None:
    call = Call()
    call.scheduler.options = SchedulerOptions(max_batch_size=1)
    story = Story(call, now=0.0)
    story.transcriber = call.transcriber
    story.transcriber.after_events = story._after_events
    call.transcriber.feed("inbound", INBOUND, 1.0)
    call.transcriber.feed("outbound", OUTBOUND, 1.0)
    story.receive_text("end", 2.0)  # the client's end: a look at 22
    story.receive_shutdown(5.0)  # then the server's: at most flush_timeout (20) from now
    batch = call.scheduler.next_batch()
    assert batch is not None
    call.scheduler.deliver(batch, call.engine.decode(batch.requests))
    story.receive_timer(22.0)  # progress: the next look would be at 42
    assert story.finished == [] and story.next_deadline() == 25.0
    story.receive_timer(25.0)
    assert story.finished == [None] and story.phase is Phase.CLOSED  # the client had ended it: no error


def test_a_transcribing_adapter_without_audio_ends_at_once_when_idle() -> None:
    story = Story(Call(("inbound",)), now=5.0)
    story.receive_timer(14.0)
    assert story.finished == []
    story.receive_timer(15.0)
    assert [type(e).__name__ for e in story.finished] == ["IdleTimeout"]
    story.receive_text("speak", 16.0)  # too late: nothing more is read
    assert story.transcriber is None
