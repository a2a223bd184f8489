from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.core.agreement import Policy, normalize_word
from streamer.core.errors import ConfigError, InvalidState
from streamer.core.events import (
    CommitRoute,
    EndReason,
    Event,
    Final,
    Lost,
    NonSpeech,
    Partial,
    SpeechEnded,
    SpeechStarted,
    Word,
)
from streamer.core.options import CLOSING_ENCODER_PAD_SECONDS, CLOSING_TEMPERATURES, CoreOptions
from streamer.core.origin import StreamOrigin
from streamer.core.requests import DecodeRequest, StreamId
from streamer.core.stream import OPENING_LIMIT_MS, CoreState, StreamCore
from streamer.core.vad import FrameClassifier, VadBackend, VadOptions
from streamer.engine.fake import (
    FakeBehaviour,
    FakeEngineError,
    ScriptedEngine,
    synthetic_silence,
    synthetic_voice,
    words_from_text,
)
from streamer.engine.types import EngineInfo

SR = 16000
SID = StreamId("s1")
MULTI = EngineInfo(model="scripted", multilingual=True, encoder="fake", decoder="fake")


@dataclass
class Scene:
    """Audio with speech at known places and the words "said" in it."""

    audio: npt.NDArray[np.float32]
    words: list[Word] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)


def scene(*parts: tuple[str, float, str]) -> Scene:
    """parts: ("speech" | "silence", seconds, text spoken in that speech)."""
    chunks, words, t = [], [], 0
    for i, (kind, seconds, text) in enumerate(parts):
        n = int(seconds * SR)
        if kind == "speech":
            chunks.append(synthetic_voice(n, seed=i))
            count = len(text.split())
            if count:
                per = n // count
                words += words_from_text(text, t + per // 10, per * 7 // 10, per * 3 // 10)
        else:
            chunks.append(synthetic_silence(n, seed=i))
        t += n
    return Scene(np.concatenate(chunks), words)


# windows that start at their utterance and come every step from its start: the schedule the tests of windowing
# mechanics count windows on (the defaults add context before an utterance, a shorter first step, and a window when
# the speech pauses; their own tests are below)
PLAIN = CoreOptions(step_ms=1000, context_ms=0, first_step_ms=None, agreement_margin_ms=0, close_ahead=False)

TWO_UTTERANCES = (
    ("silence", 1.0, ""),
    ("speech", 4.0, "the quick brown fox jumps over the lazy dog again and again"),
    ("silence", 1.5, ""),
    ("speech", 3.0, "pack my box with five dozen liquor jugs"),
    ("silence", 1.0, ""),
)


def run(
    core: StreamCore,
    engine: ScriptedEngine,
    audio: npt.NDArray[np.float32],
    chunks: Sequence[int] | int = 1600,
    lag: int = 0,
    finalize_at: Sequence[int] = (),
) -> list[Event]:
    """A minimal session: feed audio, run each request ``lag`` chunks later, end the stream, drain."""
    sizes = [chunks] * (len(audio) // chunks + 1) if isinstance(chunks, int) else list(chunks)
    events: list[Event] = []
    waiting: list[tuple[int, DecodeRequest]] = []
    pos = 0

    def deliver(req: DecodeRequest) -> None:
        try:
            [result] = engine.decode([req])
        except FakeEngineError as exc:
            core.receive_decode_failure(req.request_id, str(exc))
        else:
            core.receive_decode_result(result)

    for step, size in enumerate(sizes, start=1):
        if pos >= len(audio):
            break
        core.receive_audio(audio[pos : pos + size])
        pos += size
        if any(pos > f >= pos - size for f in finalize_at):
            core.receive_finalize()
        waiting += [(step + lag, r) for r in core.windows_to_decode()]
        while waiting and waiting[0][0] <= step:
            deliver(waiting.pop(0)[1])
            waiting += [(step + lag, r) for r in core.windows_to_decode()]
        events += core.events_received()
    if pos < len(audio):
        core.receive_audio(audio[pos:])
    core.receive_end_of_stream()
    for _, r in waiting:
        deliver(r)
    for _ in range(1000):
        requests = core.windows_to_decode()
        if not requests:
            break
        for r in requests:
            deliver(r)
    events += core.events_received()
    assert core.done, core.state
    return events


def assert_accounted(events: Sequence[Event], total: int) -> None:
    """Final + NonSpeech + Lost tile [0, total) exactly, in stream order."""
    spans = [(e.start, e.end) for e in events if isinstance(e, Final | NonSpeech | Lost)]
    assert spans, "no accounting events"
    assert spans[0][0] == 0
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end == start, f"gap or overlap at {end} / {start}"
    assert spans[-1][1] == total
    assert all(s <= e for s, e in spans)


def final_text(events: Sequence[Event]) -> str:
    return " ".join(e.text for e in events if isinstance(e, Final) and e.text)


def norm(text: str) -> list[str]:
    return [normalize_word(w) for w in text.split()]


def test_partials_then_finals_and_finals_concatenate_to_the_script() -> None:
    sc = scene(*TWO_UTTERANCES)
    core = StreamCore(CoreOptions(), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio)
    assert any(isinstance(e, Partial) for e in events)
    assert [type(e) for e in events].count(SpeechStarted) == 2
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))
    # finals arrive while speech goes on, not only at the endpoint
    first_final = next(e for e in events if isinstance(e, Final) and e.text)
    assert first_final.audio_end < 5 * SR


def test_a_final_is_never_revised_with_an_unstable_tail() -> None:
    sc = scene(*TWO_UTTERANCES)
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(unstable_last_word=True))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio)
    finals = [e for e in events if isinstance(e, Final)]
    # a segment id is used by one final only, and later partials never reuse a finalised segment id
    ids = [f.segment_id for f in finals]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert any(isinstance(e, Partial) for e in events)  # the rule below has partials to check
    for i, e in enumerate(events):
        if isinstance(e, Partial):
            assert all(f.segment_id < e.segment_id for f in events[:i] if isinstance(f, Final))
    # only the last word of each utterance is unstable; it is committed at the endpoint in its last form
    words = norm(final_text(events))
    expected = norm(sc.text)
    assert len(words) == len(expected)
    assert sum(a != b for a, b in zip(words, expected, strict=True)) <= 2
    assert_accounted(events, len(sc.audio))


def test_partials_of_one_segment_keep_their_id_until_its_final() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 6.0, " ".join(f"w{i}" for i in range(18))), ("silence", 1.0, ""))
    events = run(StreamCore(CoreOptions(agreement_n=3), SID), ScriptedEngine({SID: sc.words}), sc.audio)
    assert sum(isinstance(e, Partial) for e in events) > 1  # the rule below has partials to check
    current = None
    for e in events:
        if isinstance(e, Partial):
            current = e.segment_id if current is None else current
            assert e.segment_id == current
        elif isinstance(e, Final):
            assert current is None or e.segment_id == current
            current = None
    assert norm(final_text(events)) == norm(sc.text)


def test_endpoint_finalises_the_utterance_before_the_stream_ends() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 2.0, "hello there general kenobi"), ("silence", 3.0, ""))
    core = StreamCore(CoreOptions(step_ms=5000), SID)  # no window is due by step: only the endpoint decodes
    engine = ScriptedEngine({SID: sc.words})
    events: list[Event] = []
    for i in range(0, len(sc.audio), 800):
        core.receive_audio(sc.audio[i : i + 800])
        for r in core.windows_to_decode():
            core.receive_decode_result(engine.decode([r])[0])
        events += core.events_received()
    finals = [e for e in events if isinstance(e, Final)]
    assert core.state is CoreState.LISTENING
    assert [f.text for f in finals] == ["hello there general kenobi"]
    # the endpoint fired about endpoint_ms after speech, not at the end of the audio
    assert finals[0].end < 3.0 * SR
    assert any(isinstance(e, NonSpeech) for e in events)


@dataclass
class Timed:
    """A core fed 10 ms at a time, each window decoded at once unless ``hold`` keeps it: when (in samples received)
    each window was asked for, and each event came."""

    core: StreamCore
    engine: ScriptedEngine
    asked: list[int] = field(default_factory=list)
    events: list[tuple[int, Event]] = field(default_factory=list)
    held: list[DecodeRequest] = field(default_factory=list)

    def feed(self, audio: npt.NDArray[np.float32], hold: bool = False) -> None:
        for i in range(0, len(audio), 160):
            self.core.receive_audio(audio[i : i + 160])
            for request in self.core.windows_to_decode():
                self.asked.append(self.core.samples_received)
                if hold:
                    self.held.append(request)
                else:
                    self.core.receive_decode_result(self.engine.decode([request])[0])
            self.drain()

    def deliver(self) -> None:
        for request in self.held:
            self.core.receive_decode_result(self.engine.decode([request])[0])
        self.held.clear()
        self.drain()

    def end(self) -> list[Event]:
        """End the stream (every window decoded) and return all its events."""
        self.core.receive_end_of_stream()
        while requests := self.core.windows_to_decode():
            self.core.receive_decode_result(self.engine.decode(requests)[0])
        self.drain()
        return [e for _, e in self.events]

    def drain(self) -> None:
        self.events += [(self.core.samples_received, e) for e in self.core.events_received()]

    def at(self, kind: type[Event]) -> list[int]:
        return [n for n, e in self.events if isinstance(e, kind)]

    def finals(self) -> list[Final]:
        return [e for _, e in self.events if isinstance(e, Final)]


PAUSED = (("silence", 0.5, ""), ("speech", 2.0, "hello there general kenobi"), ("silence", 3.0, ""))


@pytest.mark.parametrize("close_ahead", [True, False])
def test_close_ahead_decodes_the_closing_window_when_the_speech_pauses(close_ahead: bool) -> None:
    """close_ahead: the window that closes an utterance is asked for once its speech pauses (pad_after_ms into the
    silence), ahead of the end point (endpoint_ms), and the end point then commits its words at once; without it the
    end point asks for that window. Either way one window, one final, the same words."""
    sc = scene(*PAUSED)
    t = Timed(
        StreamCore(CoreOptions(step_ms=5000, first_step_ms=None, close_ahead=close_ahead), SID),
        ScriptedEngine({SID: sc.words}),
    )
    t.feed(sc.audio)
    [ended] = t.at(SpeechEnded)
    [final] = t.finals()
    assert final.text == "hello there general kenobi" and final.route is CommitRoute.END_POINT
    assert len(t.asked) == 1  # no step window is due (step 5 s): only the one that closes it
    if close_ahead:
        # asked for when the 300 ms of padding after the speech had passed, about 200 ms before the 500 ms end point
        assert ended - SR // 4 <= t.asked[0] <= ended - SR * 3 // 20
    else:
        assert t.asked == [ended]
    assert t.at(Final) == [ended]  # the final comes with the end point: its window was decoded at once here


def test_a_pause_that_is_no_end_point_costs_a_window_and_commits_nothing() -> None:
    """Speech that resumes after a pause longer than pad_after_ms and shorter than the end point: the window asked for
    in the pause commits none of its words (they wait for the end point, which the pause was not), the utterance
    goes on, and the window asked for at its real pause closes it with every word once."""
    sc = scene(
        ("silence", 0.5, ""),
        ("speech", 1.5, "one two three"),
        ("silence", 0.4, ""),
        ("speech", 1.5, "four five six"),
        ("silence", 3.0, ""),
    )
    t = Timed(
        StreamCore(CoreOptions(step_ms=5000, first_step_ms=None, close_ahead=True), SID),
        ScriptedEngine({SID: sc.words}),
    )
    t.feed(sc.audio)
    [ended] = t.at(SpeechEnded)
    assert len(t.at(SpeechStarted)) == 1  # one utterance
    assert len(t.asked) == 2 and t.asked[0] < 2.4 * SR < t.asked[1] < ended
    [final] = t.finals()  # nothing committed in the first pause
    assert final.text == "one two three four five six" and t.at(Final) == [ended]
    assert_accounted(t.end(), len(sc.audio))


def test_close_ahead_commits_as_before_while_the_speech_goes_on() -> None:
    """The windows asked for while the speech goes on commit what they agree on as they do without close_ahead, even
    when each is decoded before any more audio comes (and so covers all the speech heard when it returns): only a
    window asked for once the speech paused waits for the end point."""
    sc = scene(*TWO_UTTERANCES)
    agreed: dict[bool, list[tuple[str, int]]] = {}
    for close_ahead in (True, False):
        events = run(
            StreamCore(replace(PLAIN, close_ahead=close_ahead), SID), ScriptedEngine({SID: sc.words}), sc.audio
        )
        assert norm(final_text(events)) == norm(sc.text)
        agreed[close_ahead] = [
            (e.text, e.audio_end) for e in events if isinstance(e, Final) and e.route is CommitRoute.AGREED
        ]
    assert agreed[True] and agreed[True] == agreed[False]


def test_a_window_asked_for_in_the_pause_and_decoded_after_the_end_point_closes_the_utterance() -> None:
    """The window asked for when the speech paused is still being decoded when the end point comes: no other window
    is asked for, and its result is the final."""
    sc = scene(*PAUSED)
    t = Timed(
        StreamCore(CoreOptions(step_ms=5000, first_step_ms=None, close_ahead=True), SID),
        ScriptedEngine({SID: sc.words}),
    )
    t.feed(sc.audio[: 4 * SR], hold=True)
    [ended] = t.at(SpeechEnded)
    assert t.asked[0] < ended and len(t.asked) == 1 and len(t.held) == 1 and not t.finals()
    t.deliver()
    [final] = t.finals()
    assert final.text == "hello there general kenobi" and final.route is CommitRoute.END_POINT
    assert t.core.windows_to_decode() == [] and not t.core.final_due and t.core.uncommitted_from is None
    t.feed(sc.audio[4 * SR :])
    assert len(t.asked) == 1
    assert_accounted(t.end(), len(sc.audio))


def test_finalize_commits_the_current_utterance_now() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 6.0, "one two three four five six seven eight nine ten"))
    core = StreamCore(replace(PLAIN, step_ms=5000), SID)
    engine = ScriptedEngine({SID: sc.words})
    half = 3 * SR
    core.receive_audio(sc.audio[:half])
    assert core.windows_to_decode() == []
    core.receive_finalize()
    [req] = core.windows_to_decode()
    core.receive_decode_result(engine.decode([req])[0])
    finals = [e for e in core.events_received() if isinstance(e, Final)]
    assert len(finals) == 1 and finals[0].end <= half
    said = [w.text for w in sc.words if w.end <= half]
    assert finals[0].text.split() == said
    # speech after the finalisation is a new utterance
    core.receive_audio(sc.audio[half:])
    assert any(isinstance(e, SpeechStarted) for e in core.events_received())


def test_final_due_says_when_the_next_window_closes_an_utterance() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 6.0, "one two three four five six seven eight nine ten"))
    core = StreamCore(CoreOptions(step_ms=1000), SID)
    engine = ScriptedEngine({SID: sc.words})
    core.receive_audio(sc.audio[: 3 * SR])
    assert not core.final_due  # a partial window is due, not a final one
    [partial] = core.windows_to_decode()
    core.receive_finalize()
    assert not core.final_due  # the closing window waits for the outstanding one
    core.receive_decode_result(engine.decode([partial])[0])
    assert core.final_due
    [closing] = core.windows_to_decode()
    assert not core.final_due
    core.receive_decode_result(engine.decode([closing])[0])
    assert any(isinstance(e, Final) for e in core.events_received()) and not core.final_due


def test_opening_due_says_when_the_next_window_shows_an_utterances_first_text() -> None:
    """Exactly the windows offered while no text of the utterance has been shown (an utterance's start) are opening
    ones, and a closing window is never one."""
    sc = scene(*TWO_UTTERANCES)
    core = StreamCore(CoreOptions(step_ms=1000, first_step_ms=300), SID)
    engine = ScriptedEngine({SID: sc.words})
    openings: list[bool] = []  # per window offered: whether opening_due said so just before
    shown = False  # a partial or final of the current utterance has text

    def drain() -> None:
        nonlocal shown
        for event in core.events_received():
            if isinstance(event, Partial | Final) and event.text:
                shown = not isinstance(event, Final)
            if isinstance(event, SpeechStarted):
                shown = False

    for start in range(0, len(sc.audio), 1600):
        core.receive_audio(sc.audio[start : start + 1600])
        drain()  # an end point may commit an utterance with the window decoded when its speech paused (close_ahead)
        while True:
            opening, closing = core.opening_due, core.final_due
            requests = core.windows_to_decode()
            assert not (opening and closing)
            if not requests:
                assert not opening  # it never promises a window that does not come
                break
            assert opening == (not shown and not closing)
            openings.append(opening)
            core.receive_decode_result(engine.decode(requests)[0])
            drain()
    assert openings.count(True) >= 2 and openings.count(False) >= 4  # one per utterance at least, and the rest


def test_speech_without_words_keeps_no_opening_priority_past_the_limit() -> None:
    """Voice the VAD calls speech but the model hears no words in (babble, a TV): its first windows are opening ones,
    and once OPENING_LIMIT_MS of it has been decoded without words the rest are plain partial updates, so it cannot
    keep the scheduler's priority for as long as it lasts; an utterance with words after it opens again."""
    sc = scene(("silence", 0.3, ""), ("speech", 6.0, ""), ("silence", 1.0, ""), ("speech", 1.5, "hello there"))
    core = StreamCore(CoreOptions(step_ms=500, first_step_ms=300), SID)
    engine = ScriptedEngine({SID: sc.words})
    offered: list[tuple[bool, int]] = []  # per window offered while no words were shown: opening?, its end
    for start in range(0, len(sc.audio), 1600):
        core.receive_audio(sc.audio[start : start + 1600])
        while True:
            opening = core.opening_due
            requests = core.windows_to_decode()
            if not requests:
                break
            if not core.final_due:
                offered.append((opening, requests[0].stream_offset + len(requests[0].audio)))
            core.receive_decode_result(engine.decode(requests)[0])
            core.events_received()
    babble_end = round(6.3 * SR)
    babble = [(opening, end) for opening, end in offered if end <= babble_end]
    limit = OPENING_LIMIT_MS * SR // 1000
    start = round(0.3 * SR) - CoreOptions().vad.pad_before_ms * SR // 1000  # about where the VAD starts the span
    assert len(babble) >= 8  # the babble went on well past the limit
    assert babble[0][0]  # its first window was an opening one
    assert not any(opening for opening, end in babble if end - start > limit + SR // 2)  # none well past the limit
    assert not babble[-1][0]
    assert any(opening for opening, end in offered if end > babble_end)  # the next utterance opens again


def test_end_of_stream_flushes_a_short_utterance() -> None:
    sc = scene(("silence", 0.3, ""), ("speech", 0.4, "hi"))
    events = run(StreamCore(CoreOptions(), SID), ScriptedEngine({SID: sc.words}), sc.audio)
    assert final_text(events) == "hi"
    assert_accounted(events, len(sc.audio))


def test_a_loop_is_never_committed_even_when_hypotheses_agree() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 4.0, "please call stella"), ("silence", 1.0, ""))
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(always_loop=True))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio)
    text = final_text(events)
    # every window loops after the words it heard; the guard keeps the first "thank you" of each, and two windows
    # that end in the same pause agree on it: it may be committed once there, never repeated
    assert "thank you thank you" not in text
    assert text.replace("thank you", "").split() == ["please", "call", "stella"]
    assert_accounted(events, len(sc.audio))


def test_no_speech_results_produce_no_text_but_the_audio_is_accounted() -> None:
    sc = scene(*TWO_UTTERANCES)
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(always_no_speech=True))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio)
    assert final_text(events) == ""
    assert any(isinstance(e, Final) and e.text == "" for e in events)
    assert_accounted(events, len(sc.audio))


def test_a_hypothesis_of_punctuation_alone_shows_nothing() -> None:
    """tiny.en writes a lone "." on guitar music, confident and with a low no-speech probability: no word is said."""
    sc = scene(("silence", 0.5, ""), ("speech", 4.0, ". ... -"), ("silence", 1.0, ""), ("speech", 3.0, "hello there."))
    events = run(StreamCore(CoreOptions(), SID), ScriptedEngine({SID: sc.words}), sc.audio)
    shown = [e.text for e in events if isinstance(e, Partial | Final) and e.text]
    assert shown and all("hello" in text or "there" in text for text in shown)
    assert final_text(events) == "hello there."
    assert_accounted(events, len(sc.audio))


def test_engine_failure_is_reported_as_lost_audio() -> None:
    sc = scene(*TWO_UTTERANCES)
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(fail_calls=frozenset({2})))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio)
    lost = [e for e in events if isinstance(e, Lost)]
    assert len(lost) == 1 and lost[0].end > lost[0].start and "scripted failure" in lost[0].reason
    assert final_text(events)  # the stream goes on after the failure
    assert_accounted(events, len(sc.audio))


def test_slow_results_coalesce_into_one_larger_window() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 10.0, " ".join(f"w{i}" for i in range(30))), ("silence", 1.0, ""))
    fast, slow = ScriptedEngine({SID: sc.words}), ScriptedEngine({SID: sc.words})
    run(StreamCore(CoreOptions(), SID), fast, sc.audio)
    events = run(StreamCore(CoreOptions(), SID), slow, sc.audio, lag=30)  # each result 3 s late
    assert slow.requests < fast.requests / 2
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))


def test_one_outstanding_request_and_unique_ids() -> None:
    sc = scene(("silence", 1.0, ""), ("speech", 5.0, "a b c d e f"))
    core = StreamCore(CoreOptions(), SID)
    core.receive_audio(sc.audio[: 3 * SR])
    [first] = core.windows_to_decode()
    assert core.pending and core.windows_to_decode() == []
    # the window skips the leading silence but keeps the VAD's padding before the speech (which starts at 0.5 s)
    assert first.stream_id == SID
    assert 0 < first.stream_offset <= SR - CoreOptions().vad.pad_before_ms * SR // 1000
    assert core.backlog_samples < 3 * SR
    core.receive_audio(sc.audio[3 * SR :])
    assert core.backlog_samples >= 2 * SR - 8000
    core.receive_decode_result(ScriptedEngine({SID: sc.words}).decode([first])[0])
    [second] = core.windows_to_decode()
    assert second.request_id != first.request_id
    assert second.stream_offset + len(second.audio) > first.stream_offset + len(first.audio)
    with pytest.raises(InvalidState):
        core.receive_decode_result(ScriptedEngine({SID: sc.words}).decode([first])[0])


def test_prompt_is_recent_committed_text_bounded() -> None:
    words = " ".join(f"word{i}" for i in range(80))
    sc = scene(("silence", 0.5, ""), ("speech", 30.0, words), ("silence", 1.0, ""))
    core = StreamCore(CoreOptions(prompt_max_chars=50), SID)
    prompts: list[str] = []
    engine = ScriptedEngine(lambda r: prompts.append(r.prompt) or sc.words)
    run(core, engine, sc.audio)
    assert max(len(p) for p in prompts) <= 50
    assert prompts[-1].split()[-1].startswith("word")


def test_long_stream_keeps_memory_bounded() -> None:
    """Ten minutes of speech with short pauses: the buffer never holds more than a window and a bit."""
    parts: list[tuple[str, float, str]] = []
    for i in range(60):
        parts += [("speech", 9.0, " ".join(f"w{i}x{j}" for j in range(20))), ("silence", 1.0, "")]
    sc = scene(*parts)
    core = StreamCore(CoreOptions(), SID)
    engine = ScriptedEngine({SID: sc.words})
    peak = 0
    for i in range(0, len(sc.audio), 16000):
        core.receive_audio(sc.audio[i : i + 16000])
        for r in core.windows_to_decode():
            core.receive_decode_result(engine.decode([r])[0])
        peak = max(peak, core._buffer.capacity)
    core.receive_end_of_stream()
    while reqs := core.windows_to_decode():
        core.receive_decode_result(engine.decode(reqs)[0])
    assert core.state is CoreState.ENDED
    assert peak <= 4 * 30 * SR
    assert len(core._buffer) < 30 * SR


def test_speech_longer_than_a_window_is_force_committed() -> None:
    text = " ".join(f"v{i}" for i in range(120))
    sc = scene(("speech", 40.0, text), ("silence", 1.0, ""))
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(unstable_last_word=True))
    events = run(StreamCore(CoreOptions(agreement_n=5, max_window_ms=10000, step_ms=3000), SID), engine, sc.audio)
    assert engine.samples_decoded / engine.requests <= 10 * SR
    assert_accounted(events, len(sc.audio))
    # the finals say how they were committed: forced by the window limit while the speech went on, the rest at its end
    routes = [e.route for e in events if isinstance(e, Final) and e.text]
    assert CommitRoute.WINDOW_LIMIT in routes and routes[-1] is CommitRoute.END_POINT


SCENARIOS = {
    "two utterances": (TWO_UTTERANCES, FakeBehaviour()),
    "silence only": ((("silence", 3.0, ""),), FakeBehaviour()),
    "speech only": ((("speech", 3.0, "just speech here"),), FakeBehaviour()),
    "unstable": (TWO_UTTERANCES, FakeBehaviour(unstable_last_word=True)),
    "failures": (TWO_UTTERANCES, FakeBehaviour(fail_calls=frozenset({1, 3, 4}))),
    "loops": (TWO_UTTERANCES, FakeBehaviour(loop_calls=frozenset({2, 3}))),
    "no speech": (TWO_UTTERANCES, FakeBehaviour(no_speech_calls=frozenset({1, 2, 5}))),
}


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("chunk", [160, 1600, 7777])
@pytest.mark.parametrize("lag", [0, 5])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_accounting_invariant(name: str, lag: int, chunk: int, policy: Policy) -> None:
    parts, behaviour = SCENARIOS[name]
    sc = scene(*parts)
    core = StreamCore(CoreOptions(policy=policy), SID)
    events = run(core, ScriptedEngine({SID: sc.words}, behaviour), sc.audio, chunk, lag)
    assert_accounted(events, len(sc.audio))


def test_alignatt_commits_sooner_than_local_agreement_with_the_same_words() -> None:
    """AlignAtt commits in one decode what LocalAgreement-2 needs two for: the same finals, their words out after
    fewer windows of its utterance, so earlier on the stream clock (LocalAgreement without its margin, which only
    delays)."""
    sc = scene(*TWO_UTTERANCES)
    committed_at: dict[Policy, list[int]] = {}
    for policy in Policy:
        options = replace(PLAIN, policy=policy)
        events = run(StreamCore(options, SID), ScriptedEngine({SID: sc.words}), sc.audio)
        assert norm(final_text(events)) == norm(sc.text)
        assert_accounted(events, len(sc.audio))
        # where the stream had got to when each word became final
        committed_at[policy] = [e.audio_end for e in events if isinstance(e, Final) for _ in e.words]
    assert len(committed_at[Policy.ALIGNATT]) == len(committed_at[Policy.LOCAL_AGREEMENT]) == len(sc.words)
    assert all(a <= b for a, b in zip(committed_at[Policy.ALIGNATT], committed_at[Policy.LOCAL_AGREEMENT], strict=True))
    assert sum(committed_at[Policy.ALIGNATT]) < sum(committed_at[Policy.LOCAL_AGREEMENT])


@pytest.mark.parametrize(("lag", "like"), [(0, Policy.LOCAL_AGREEMENT), (20, Policy.ALIGNATT)])
def test_auto_agrees_while_the_engine_keeps_up_and_follows_the_attention_when_it_lags(lag: int, like: Policy) -> None:
    """The auto policy commits exactly as LocalAgreement when every window is decoded at once (windows a step of
    1 s apart: within the step and 500 ms), and exactly as AlignAtt when each result comes 2 s late (every window
    waited longer)."""
    sc = scene(*TWO_UTTERANCES)
    committed_at: dict[Policy, list[int]] = {}
    for policy in Policy:
        options = replace(PLAIN, policy=policy, auto_wait_ms=500)
        events = run(StreamCore(options, SID), ScriptedEngine({SID: sc.words}), sc.audio, lag=lag)
        assert norm(final_text(events)) == norm(sc.text)
        assert_accounted(events, len(sc.audio))
        committed_at[policy] = [e.audio_end for e in events if isinstance(e, Final) for _ in e.words]
    assert committed_at[Policy.AUTO] == committed_at[like]
    # the two policies commit differently on this run, so the equality above tells them apart
    assert committed_at[Policy.LOCAL_AGREEMENT] != committed_at[Policy.ALIGNATT]


def test_alignatt_never_commits_a_word_whose_alignment_reaches_the_margin() -> None:
    sc = scene(*TWO_UTTERANCES)
    margin_ms = 700
    core = StreamCore(CoreOptions(policy=Policy.ALIGNATT, alignatt_margin_ms=margin_ms), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio)
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    for final in (e for e in events if isinstance(e, Final) and e.words):
        closing = any(final.end == end.end for end in ended)  # an utterance's last final commits everything
        if not closing:
            assert final.words[-1].end <= final.audio_end - margin_ms * SR // 1000


def test_accounting_invariant_with_finalize_and_empty_stream() -> None:
    sc = scene(*TWO_UTTERANCES)
    events = run(StreamCore(CoreOptions(), SID), ScriptedEngine({SID: sc.words}), sc.audio, finalize_at=[3 * SR])
    assert_accounted(events, len(sc.audio))
    core = StreamCore(CoreOptions(), SID)
    core.receive_audio(np.zeros(0, dtype=np.float32))
    core.receive_end_of_stream()
    assert core.done and core.events_received() == []


_PROPERTY_SCENE = scene(*TWO_UTTERANCES)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=12000), min_size=1, max_size=60),
    lag=st.integers(min_value=0, max_value=4),
    unstable=st.booleans(),
)
def test_accounting_invariant_over_random_chunkings(cuts: list[int], lag: int, unstable: bool) -> None:
    sc = _PROPERTY_SCENE
    engine = ScriptedEngine({SID: sc.words}, FakeBehaviour(unstable_last_word=unstable))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio, cuts, lag)
    assert_accounted(events, len(sc.audio))
    if not unstable:
        assert norm(final_text(events)) == norm(sc.text)


def test_wrong_state_calls_raise_invalid_state() -> None:
    core = StreamCore(CoreOptions(), SID)
    core.receive_end_of_stream()
    assert core.state is CoreState.ENDED
    with pytest.raises(InvalidState):
        core.receive_audio(np.zeros(160, dtype=np.float32))
    with pytest.raises(InvalidState):
        core.receive_finalize()
    with pytest.raises(InvalidState):
        core.receive_end_of_stream()
    with pytest.raises(InvalidState):
        core.receive_decode_failure(7, "nope")


def test_ending_until_the_last_decode_is_done() -> None:
    sc = scene(("speech", 2.0, "almost done"))
    core = StreamCore(CoreOptions(), SID)
    core.receive_audio(sc.audio)
    core.receive_end_of_stream()
    assert core.state is CoreState.ENDING and not core.done
    [req] = core.windows_to_decode()
    core.receive_decode_result(ScriptedEngine({SID: sc.words}).decode([req])[0])
    assert core.state is CoreState.ENDED and not core.done  # events still to drain
    assert final_text(core.events_received()) == "almost done"
    assert core.done


def test_a_core_refuses_invalid_options_and_origins() -> None:
    with pytest.raises(ConfigError, match="step_ms"):
        StreamCore(CoreOptions(step_ms=100))
    with pytest.raises(ConfigError, match="replay_from"):
        StreamCore(CoreOptions(), SID, StreamOrigin(start=SR, replay_from=SR + 1))


def test_a_model_backed_vad_is_made_by_the_factory_the_runner_passes() -> None:
    # the core imports no model (issue 38): --vad silero's classifier comes from whoever makes the core
    options = replace(PLAIN, vad=VadOptions(backend=VadBackend.SILERO))
    with pytest.raises(ConfigError, match="silero voice activity detector"):
        StreamCore(options, SID)
    made: list[VadOptions] = []

    class AllVoiced:
        frame_samples = 512

        def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
            return np.ones(len(frames), dtype=np.bool_)

    def everything_voiced(vad: VadOptions) -> FrameClassifier:
        made.append(vad)
        return AllVoiced()

    sc = scene(("speech", 2.0, "hello there"), ("silence", 1.0, ""))
    core = StreamCore(options, SID, vad_classifiers={VadBackend.SILERO: everything_voiced})
    events = run(core, ScriptedEngine(sc.words), sc.audio)
    # one stream, one classifier, under the core's endpoint; and it alone decided: the silence is speech too
    assert [m.min_silence_ms for m in made] == [options.endpoint_ms]
    assert not any(isinstance(e, NonSpeech) for e in events)
    assert_accounted(events, len(sc.audio))


def test_windows_reread_the_utterance_and_the_prompt_holds_only_text_before_the_window() -> None:
    """After a commit the next window still starts at the utterance start (context for the model), and the
    committed words it re-reads are neither repeated in the finals nor fed back as a prompt."""
    sc = scene(*TWO_UTTERANCES)
    requests: list[DecodeRequest] = []
    engine = ScriptedEngine(lambda r: requests.append(r) or sc.words)
    events = run(StreamCore(replace(PLAIN, step_ms=500), SID), engine, sc.audio)
    first_utterance = [r for r in requests if r.stream_offset < 5 * SR]
    assert len({r.stream_offset for r in first_utterance}) == 1  # every window of it starts at its start
    assert len(first_utterance) >= 4
    assert all(r.prompt == "" for r in first_utterance)
    second = [r for r in requests if r.stream_offset >= 5 * SR]
    assert second and all(r.prompt == "the quick brown fox jumps over the lazy dog again and again" for r in second)
    assert norm(final_text(events)) == norm(sc.text)


def test_long_utterances_move_the_window_start_to_a_committed_sentence_end() -> None:
    text = " ".join(f"w{i}." if i % 6 == 5 else f"w{i}" for i in range(60))
    sc = scene(("silence", 0.5, ""), ("speech", 25.0, text), ("silence", 1.0, ""))
    requests: list[DecodeRequest] = []
    engine = ScriptedEngine(lambda r: requests.append(r) or sc.words)
    events = run(StreamCore(CoreOptions(trim_after_ms=8000), SID), engine, sc.audio)
    assert max(len(r.audio) for r in requests) <= 12 * SR  # 25 s of speech, windows kept near 8 s
    starts = sorted({r.stream_offset for r in requests})
    assert len(starts) > 1
    sentence_ends = {w.end for w in sc.words if w.text.endswith(".")}
    assert all(s in sentence_ends or s == starts[0] for s in starts)  # trims fall after a full sentence
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))


def test_each_utterance_says_where_its_speech_ended_before_its_last_final() -> None:
    """The end point is an event of its own (speech_ended, OpenAI's speech_stopped, Deepgram's UtteranceEnd), out
    as soon as the VAD decides, so a protocol can send it a decode earlier than the utterance's last final."""
    sc = scene(*TWO_UTTERANCES)
    core = StreamCore(CoreOptions(), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio, lag=2)
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    started = [e for e in events if isinstance(e, SpeechStarted)]
    assert len(ended) == len(started) == 2
    assert [e.reason for e in ended] == [EndReason.VAD, EndReason.VAD]
    for end in ended:
        utterance = [e for e in events if isinstance(e, Final) and end.start <= e.start < end.end]
        assert utterance, "an utterance's finals come from the audio it names"
        assert events.index(end) < events.index(utterance[-1])
        assert end.end == utterance[-1].end  # the last final accounts for the speech up to the end point
    # the end points are where the scene's speech ends, give or take the VAD's padding
    assert abs(ended[0].end - 5.0 * SR) < 0.5 * SR and abs(ended[1].end - 9.5 * SR) < 0.5 * SR


def test_a_finalize_and_the_end_of_the_stream_close_an_utterance_with_their_own_reason() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 6.0, "one two three four five six seven eight nine ten"))
    core = StreamCore(CoreOptions(step_ms=5000), SID)
    core.receive_audio(sc.audio[: 3 * SR])
    core.receive_finalize()
    [ended] = [e for e in core.events_received() if isinstance(e, SpeechEnded)]
    assert ended.reason is EndReason.FINALIZE and ended.end <= 3 * SR
    core.receive_audio(sc.audio[3 * SR :])
    core.receive_end_of_stream()
    [ended] = [e for e in core.events_received() if isinstance(e, SpeechEnded)]
    assert ended.reason is EndReason.END_OF_STREAM and ended.start >= 3 * SR


def test_finals_and_partials_name_the_language_their_window_was_decoded_in() -> None:
    sc = scene(*TWO_UTTERANCES)
    core = StreamCore(CoreOptions(), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio, lag=1)
    transcripts = [e for e in events if isinstance(e, Final | Partial)]
    assert transcripts and {e.language for e in transcripts} == {"en"}


def test_a_language_the_session_did_not_fix_is_detected_once_per_utterance() -> None:
    """Each window of an utterance is decoded in the language its first committed words were detected in: later
    windows that would detect another (a flaky detector) cannot split the utterance in two."""
    sc = scene(*TWO_UTTERANCES)
    requests: list[DecodeRequest] = []
    detections: list[int] = []

    def detect(request: DecodeRequest) -> str:
        detections.append(request.request_id)
        return "it" if len(detections) > 3 else "de"

    engine = ScriptedEngine(lambda r: requests.append(r) or sc.words, FakeBehaviour(detect_language=detect), MULTI)
    # the flaky detector turns after three windows: the first utterance's words must commit within them
    events = run(StreamCore(PLAIN, SID), engine, sc.audio, lag=1)
    finals = [e for e in events if isinstance(e, Final) and e.text]
    first = [f for f in finals if f.start < 5 * SR]  # the second utterance's padding starts at 6 s
    second = [f for f in finals if f.start >= 5 * SR]
    assert first and {f.language for f in first} == {"de"}
    assert second and {f.language for f in second} == {"it"}  # detected afresh for the next utterance
    assert norm(final_text(events)) == norm(sc.text)
    # once an utterance's words commit, its windows name its language and are no longer detected
    pinned = [r for r in requests if r.options.language is not None]
    assert pinned and {r.options.language for r in pinned} == {"de", "it"}
    assert len(detections) + len(pinned) == len(requests)


def test_a_language_the_session_fixed_is_on_every_request_and_final() -> None:
    sc = scene(*TWO_UTTERANCES)
    options = CoreOptions()
    core = StreamCore(replace(options, decode=replace(options.decode, language="sv")), SID)
    seen: list[str | None] = []
    engine = ScriptedEngine(lambda r: seen.append(r.options.language) or sc.words, info=MULTI)
    events = run(core, engine, sc.audio, lag=1)
    assert set(seen) == {"sv"}
    assert {e.language for e in events if isinstance(e, Final)} == {"sv"}


def test_configure_changes_the_prompt_and_keywords_from_the_next_window() -> None:
    sc = scene(("silence", 0.5, ""), ("speech", 6.0, "one two three four five six seven eight nine ten"))
    core = StreamCore(CoreOptions(), SID)
    core.receive_audio(sc.audio[: int(1.6 * SR)])
    [before] = core.windows_to_decode()
    core.receive_configure("A talk about counting.", ("seven", "Nine"))
    assert before.options.keywords == () and before.options.initial_prompt == ""
    core.receive_decode_result(ScriptedEngine({SID: sc.words}).decode([before])[0])
    core.receive_audio(sc.audio[int(1.6 * SR) : 3 * SR])
    [after] = core.windows_to_decode()
    assert after.options.keywords == ("seven", "Nine")
    assert after.options.initial_prompt == "A talk about counting."
    with pytest.raises(ConfigError, match="keywords"):
        core.receive_configure("", ("x" * 51,))
    assert core.options.decode.keywords == ("seven", "Nine")  # a refused configure changes nothing
    core.receive_end_of_stream()
    with pytest.raises(InvalidState):
        core.receive_configure("", ())


def test_a_core_takes_a_stream_over_where_another_accounted_for_it() -> None:
    """The takeover of a resumed session on another replica (issue 18): a second core starts at the first one's
    accounted position with its next segment id; the two cores' events tile the stream and their finals are the
    script, no word lost or repeated."""
    sc = scene(*TWO_UTTERANCES)
    engine = ScriptedEngine({SID: sc.words})
    first = StreamCore(CoreOptions(), SID)
    cut = 7 * SR  # mid-way: the first utterance is final, the second one is under way
    events = run_until(first, engine, sc.audio[:cut])
    accounted = max(e.end for e in events if isinstance(e, Final | NonSpeech | Lost))
    finals = [e for e in events if isinstance(e, Final)]
    assert 0 < accounted < cut and finals
    origin = StreamOrigin(accounted, first.next_segment_id, finals[-1].words)
    second = StreamCore(CoreOptions(), SID, origin)
    assert second.samples_received == accounted and second.next_segment_id == first.next_segment_id
    after = run(second, engine, sc.audio[accounted:])
    both = [e for e in events if not isinstance(e, Partial)] + after
    assert_accounted([e for e in both if isinstance(e, Final | NonSpeech | Lost)], len(sc.audio))
    assert norm(final_text(both)) == norm(sc.text)
    segments = [e.segment_id for e in both if isinstance(e, Final)]
    assert segments == sorted(set(segments)) and min(e.segment_id for e in after if isinstance(e, Final)) >= len(finals)


LONG_SENTENCES = (
    ("silence", 0.5, ""),
    ("speech", 12.0, "one two three four. five six seven eight. nine ten eleven twelve. thirteen fourteen fifteen."),
    ("silence", 1.0, ""),
    ("speech", 4.0, "sixteen seventeen eighteen nineteen twenty"),
    ("silence", 1.0, ""),
)
TAKEOVER_SCENES = {
    "two utterances": (TWO_UTTERANCES, CoreOptions()),
    # windows re-read a long utterance from a trim point, not its start: the takeover must re-read from there too
    "trimmed": (LONG_SENTENCES, CoreOptions(trim_after_ms=3000)),
}


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("name", sorted(TAKEOVER_SCENES))
def test_a_takeover_that_rereads_the_context_continues_as_the_uncut_core(name: str, policy: Policy) -> None:
    """Issue 18: a core that takes the stream over at the accounted position, fed the audio from the other core's
    context_start, accounts for exactly [start, end), says nothing of what was heard before start, and commits the
    same words after start as the core that was never cut, wherever the cut falls."""
    parts, options = TAKEOVER_SCENES[name]
    options = replace(options, policy=policy)
    sc = scene(*parts)
    cuts = range(8 * 1600, len(sc.audio) - 1600, 3 * 1600)  # every 0.3 s from 0.8 s
    reread = 0
    for cut in cuts:
        starts: list[int] = []  # where each window decoded since the cut starts

        def script(request: DecodeRequest, starts: list[int] = starts) -> list[Word]:
            starts.append(request.stream_offset)
            return sc.words

        engine = ScriptedEngine(script)
        first = StreamCore(options, SID)
        before = run_until(first, engine, sc.audio[:cut])
        accounted = max((e.end for e in before if isinstance(e, Final | NonSpeech | Lost)), default=0)
        context = tuple(w for e in before if isinstance(e, Final) for w in e.words)
        replay_from = first.context_start
        assert max(0, accounted - 30 * SR) <= replay_from <= accounted, (cut, replay_from, accounted)
        last_before = starts[-1:]
        starts.clear()
        uncut = run(first, engine, sc.audio[cut:])
        uncut_starts = starts[:]
        origin = StreamOrigin(accounted, first.next_segment_id, context, replay_from)
        second = StreamCore(options, SID, origin)
        starts.clear()
        after = run(second, engine, sc.audio[replay_from:])
        # the windows re-read the utterance from where the uncut core's did (mid-utterance: before the origin); where
        # the uncut core decoded none after the cut (close_ahead: the window it asked for when the speech paused
        # before the cut closed the utterance at the end point after it), from where its last one did, if at all
        if uncut_starts:
            assert starts[:1] == uncut_starts[:1], (cut, starts[:1], uncut_starts[:1])
        else:
            assert starts[:1] in ([], last_before), (cut, starts[:1], last_before)
        reread += replay_from < accounted
        spans = [e for e in after if isinstance(e, Final | NonSpeech | Lost)]
        assert spans and spans[0].start == accounted, (cut, spans[:1], accounted)
        for a, b in itertools.pairwise(spans):
            assert a.end == b.start, (cut, a, b)
        assert spans[-1].end == len(sc.audio)
        started = [e.start for e in after if isinstance(e, SpeechStarted)]
        assert all(start >= accounted for start in started), (cut, started, accounted)
        expected = norm(final_text([e for e in uncut if isinstance(e, Final)]))
        assert norm(final_text(after)) == expected, (cut, replay_from, accounted)
        assert expected == norm(sc.text)[len(norm(final_text(before))) :]  # the script, nothing lost or repeated
    assert reread >= len(cuts) // 3  # many cuts fall mid-utterance, where the context matters


def run_until(core: StreamCore, engine: ScriptedEngine, audio: npt.NDArray[np.float32]) -> list[Event]:
    """Feed ``audio`` 100 ms at a time, decoding every window at once; the stream stays open."""
    events: list[Event] = []
    for start in range(0, len(audio), 1600):
        core.receive_audio(audio[start : start + 1600])
        while requests := core.windows_to_decode():
            for result in engine.decode(requests):
                core.receive_decode_result(result)
        events += core.events_received()
    return events


@pytest.mark.parametrize("policy", list(Policy))
def test_held_words_wait_for_the_end_point_and_are_shown_meanwhile(policy: Policy) -> None:
    """With commit_hold_ms longer than each utterance, every utterance is committed by one final at its end point,
    from a window that re-reads it whole; the words settled before it are in the partials."""
    sc = scene(*TWO_UTTERANCES)
    core = StreamCore(CoreOptions(policy=policy, commit_hold_ms=5000), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio)
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    finals = [e for e in events if isinstance(e, Final) and e.text]
    assert len(finals) == len(ended) == 2
    assert all(f.end == e.end for f, e in zip(finals, ended, strict=True))
    assert all(f.route is CommitRoute.END_POINT for f in finals)
    partials = [e for e in events if isinstance(e, Partial) and e.text]
    first = finals[0]
    # the longest partial before the first final shows words a held-back policy had already settled
    longest = max((p for p in partials if p.segment_id == first.segment_id), key=lambda p: len(p.words))
    assert len(longest.words) >= len(first.words) - 3


def test_an_utterance_longer_than_the_hold_commits_settled_words_before_its_end() -> None:
    text = " ".join(f"w{i}" for i in range(40))
    sc = scene(("silence", 1.0, ""), ("speech", 12.0, text), ("silence", 1.0, ""))
    core = StreamCore(CoreOptions(commit_hold_ms=4000), SID)
    events = run(core, ScriptedEngine({SID: sc.words}), sc.audio)
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))
    finals = [e for e in events if isinstance(e, Final) and e.text]
    assert len(finals) >= 3
    # nothing is committed while the uncommitted speech is within the hold
    assert finals[0].audio_end - finals[0].start > 4000 * SR // 1000
    # past it the policy commits the settled words (the route says so), and the end point the rest
    assert finals[0].route is CommitRoute.AGREED and finals[-1].route is CommitRoute.END_POINT


def test_windows_come_every_first_step_ms_until_the_segment_shows_words() -> None:
    lags: dict[int | None, list[int]] = {400: [], None: []}
    for lead in np.arange(0.6, 1.6, 0.1):  # where the speech starts moves the step's grid against the first word
        # slow speech: the first word ends 1.3 s after the VAD's padded start, past the first step's window
        sc = scene(("silence", float(lead), ""), ("speech", 4.0, "the quick brown fox"), ("silence", 1.0, ""))
        for first_step_ms, found in lags.items():
            engine = ScriptedEngine({SID: sc.words})
            events = run(StreamCore(replace(PLAIN, first_step_ms=first_step_ms), SID), engine, sc.audio)
            assert norm(final_text(events)) == norm(sc.text)
            partial = next(e for e in events if isinstance(e, Partial))
            found.append(partial.audio_end - sc.words[0].end)
    # a window every 400 ms until words show: the first partial comes within 400 ms (and a chunk) of the end of the
    # first word, not up to a whole step later
    assert max(lags[400]) <= 500 * SR // 1000 < max(lags[None]) <= 1100 * SR // 1000
    assert sum(lags[400]) < sum(lags[None])


def recording_requests(sc: Scene) -> tuple[ScriptedEngine, list[DecodeRequest]]:
    """An engine that says the scene's words and keeps every request it decodes."""
    requests: list[DecodeRequest] = []

    def script(request: DecodeRequest) -> list[Word]:
        requests.append(request)
        return sc.words

    return ScriptedEngine(script), requests


def spans(requests: Sequence[DecodeRequest]) -> list[tuple[int, int]]:
    """The ``[start, end)`` of each request's window, on the stream."""
    return [(r.stream_offset, r.stream_offset + len(r.audio)) for r in requests]


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("lag", [0, 5])
def test_an_utterance_soon_after_another_is_decoded_with_it_as_context(policy: Policy, lag: int) -> None:
    """With context_ms, the second utterance's windows start inside the first (ended 1.5 s before it), at the start
    of its last sentence: the words re-read there are not committed twice, and every sample is accounted once."""
    sc = scene(
        ("silence", 1.0, ""),
        ("speech", 4.0, "the quick brown fox jumps over the lazy dog. Again and again"),
        ("silence", 1.5, ""),
        ("speech", 3.0, "pack my box with five dozen liquor jugs"),
        ("silence", 1.0, ""),
    )
    engine, requests = recording_requests(sc)
    core = StreamCore(CoreOptions(policy=policy, context_ms=3000), SID)
    events = run(core, engine, sc.audio, lag=lag)
    offsets = spans(requests)
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))
    first, second = (e for e in events if isinstance(e, SpeechEnded))
    # every window of the second utterance starts in the first one's speech, less than 3 s before its own start,
    # between "dog." and "Again"
    again = next(w for w in sc.words if w.text == "Again")
    seconds = [start for start, end in offsets if end > second.start]
    assert seconds and all(second.start - 3 * SR <= start < first.end for start in seconds)
    assert all(abs(start - again.start) < SR // 2 for start in seconds)


@pytest.mark.parametrize("gap", [0.7, 0.9, 1.2])
def test_context_reaching_behind_a_queued_utterance_is_kept_while_the_engine_lags(gap: float) -> None:
    """With results 3 s late, utterances queue up: one queued behind the head can take its context from words
    committed before the head's own start, and that audio must still be buffered when its turn comes (it was cut
    away with the head's, and the window fell outside the buffer)."""
    parts: list[tuple[str, float, str]] = [("silence", 0.5, "")]
    for k in range(5):
        parts += [("speech", 1.5, f"w{k}a w{k}b w{k}c."), ("silence", gap, "")]
    sc = scene(*parts)
    events = run(StreamCore(CoreOptions(context_ms=10000), SID), ScriptedEngine({SID: sc.words}), sc.audio, lag=30)
    assert norm(final_text(events)) == norm(sc.text)
    assert_accounted(events, len(sc.audio))


LATE_SCENE = (
    ("silence", 1.0, ""),
    ("speech", 3.0, "the quick brown fox jumps."),
    ("speech", 3.0, "Over the lazy dog again."),
    ("silence", 1.5, ""),
    ("speech", 4.0, "pack my box with five dozen liquor jugs"),
    ("silence", 1.0, ""),
)


@pytest.mark.parametrize("policy", list(Policy))
def test_a_window_that_waited_for_the_engine_reads_less_context_and_padding(policy: Policy) -> None:
    """Results 1.5 s late (past a step and auto_wait_ms): each window of the second utterance waited, so it starts
    at most late_context_ms before the utterance (at a committed sentence's start) and its encoder reads
    late_encoder_pad_seconds of silence; with prompt results the same utterance reads its whole context and the
    stream's padding. Either way the transcript is whole and every sample is accounted once."""
    sc = scene(*LATE_SCENE)
    options = CoreOptions(policy=policy, context_ms=10000, late_context_ms=4000, late_encoder_pad_seconds=3.0)
    seen: dict[int, list[DecodeRequest]] = {}
    for lag in (0, 15):
        engine, requests = recording_requests(sc)
        events = run(StreamCore(options, SID), engine, sc.audio, lag=lag)
        assert norm(final_text(events)) == norm(sc.text)
        assert_accounted(events, len(sc.audio))
        second = [e for e in events if isinstance(e, SpeechStarted)][1]
        seen[lag] = [r for r in requests if r.stream_offset + len(r.audio) > second.start]
    over = next(w for w in sc.words if w.text == "Over")
    the_quick = sc.words[0]
    prompt, late = seen[0], seen[15]
    # prompt results: every window re-reads from the first sentence's start, 8.5 s before, padded 10 s
    assert prompt and all(abs(r.stream_offset - the_quick.start) < SR // 2 for r in prompt)
    assert {r.options.encoder_pad_seconds for r in prompt} == {options.decode.encoder_pad_seconds}
    # late results: the second sentence's start, 5.5 s before (the first is beyond 4 s), padded 3 s
    assert late and all(abs(r.stream_offset - over.start) < SR // 2 for r in late)
    assert {r.options.encoder_pad_seconds for r in late} == {3.0}


def test_by_default_a_late_window_is_decoded_as_any_other() -> None:
    """The defaults (chosen on the tuning half: the delay cheaper late windows saved cost accuracy) give a late
    window the whole context and the stream's padding."""
    sc = scene(*LATE_SCENE)
    options = CoreOptions()
    assert options.context_ms == 10000
    engine, requests = recording_requests(sc)
    events = run(StreamCore(options, SID), engine, sc.audio, lag=15)
    assert norm(final_text(events)) == norm(sc.text)
    second = [e for e in events if isinstance(e, SpeechStarted)][1]
    late = [r for r in requests if r.stream_offset + len(r.audio) > second.start]
    assert late and all(abs(r.stream_offset - sc.words[0].start) < SR // 2 for r in late)
    assert {r.options.encoder_pad_seconds for r in late} == {options.decode.encoder_pad_seconds}


def test_no_context_is_taken_from_inside_a_sentence() -> None:
    """The first utterance has no sentence end: a window cut inside it would derail the decoder, so the second
    utterance's windows start at the utterance itself."""
    sc = scene(*TWO_UTTERANCES)
    engine, requests = recording_requests(sc)
    events = run(StreamCore(CoreOptions(context_ms=3000), SID), engine, sc.audio)
    offsets = spans(requests)
    assert norm(final_text(events)) == norm(sc.text)
    second = [e for e in events if isinstance(e, SpeechStarted)][1]
    starts = [start for start, _ in offsets]
    assert second.start in starts and all(s == second.start for s in starts if s > 3 * SR)


@pytest.mark.parametrize("close_ahead", [True, False])
def test_a_last_window_that_comes_back_empty_keeps_what_the_window_before_heard(close_ahead: bool) -> None:
    """The window that closes an utterance (asked for at its end point, or with close_ahead once its speech paused)
    comes back with no words (the model stopped early) while the one before it heard the utterance: its words are
    committed, not lost."""
    sc = scene(*TWO_UTTERANCES)
    engine = ScriptedEngine({SID: sc.words})
    core = StreamCore(CoreOptions(close_ahead=close_ahead), SID)
    events: list[Event] = []
    emptied = 0
    speech_ends = (5 * SR, int(9.5 * SR))  # where the scene's speech stops

    def closes(request: DecodeRequest, final_due: bool) -> bool:
        """Asked for at the end point or, with close_ahead, once the speech paused: it ends where the 300 ms of VAD
        padding after the speech do (a window asked for in the padding ends before)."""
        if not close_ahead:
            return final_due
        end = request.stream_offset + request.audio.size
        return any(stop + 3 * SR // 10 <= end <= stop + SR for stop in speech_ends)

    def pump() -> None:
        nonlocal emptied
        while True:
            final_due = core.final_due
            requests = core.windows_to_decode()
            if not requests:
                break
            [result] = engine.decode(requests)
            if closes(requests[0], final_due):
                result = replace(result, text="", segments=())
                emptied += 1
            core.receive_decode_result(result)
        events.extend(core.events_received())

    for i in range(0, len(sc.audio), 1600):
        core.receive_audio(sc.audio[i : i + 1600])
        pump()
    core.receive_end_of_stream()
    pump()
    assert emptied == 2
    assert_accounted(events, len(sc.audio))
    # LocalAgreement-2 had committed the words two windows agreed on; the rest comes from the last hypothesis, which
    # ended up to a step before the utterance's end: most of the words, none twice
    said, heard = norm(sc.text), norm(final_text(events))
    assert len(heard) >= len(said) - 4
    assert not Counter(heard) - Counter(said)


LONG_SENTENCE = (
    "another case said john wesley was a little girl half grown who was washing windows upstairs one day and "
    "unluckily fell asleep in the window and in this position was found"
)


def stops_early(words: Sequence[Word], after: int, moved_by: int) -> Callable[[DecodeRequest], list[Word]]:
    """A decoder that, on a window starting before ``words[after - 1]`` ends, writes ``words[after]`` and stops:
    DTW puts that last word, with no length, ``moved_by`` samples later, over the speech it left unwritten (tiny.en
    on LibriSpeech 8463-287645-0007: "one day, and" and then end-of-text with 3.6 s of the utterance left). A window
    starting there hears the rest."""
    stop = words[after - 1].end

    def script(request: DecodeRequest) -> list[Word]:
        if request.stream_offset >= stop:
            return list(words)
        last = words[after]
        return [*words[:after], Word(last.text, last.start + moved_by, last.start + moved_by, last.probability)]

    return script


@pytest.mark.parametrize("lag", [0, 10, 40])
def test_a_closing_window_that_stops_early_is_decoded_again_from_where_it_stopped(lag: int) -> None:
    """Every window of an utterance stops after "and" (``stops_early``), and LocalAgreement commits "and" where DTW
    moved it, 2 s into the words never written; the window that closes the utterance stops there too. Its rest is
    decoded again from the end of "day", prompted with the text up to it: every word is final once, none lost."""
    sc = scene(("silence", 1.0, ""), ("speech", 12.0, LONG_SENTENCE), ("silence", 1.5, ""))
    after = LONG_SENTENCE.split().index("and")
    requests: list[DecodeRequest] = []
    script = stops_early(sc.words, after, 2 * SR)
    engine = ScriptedEngine(lambda r: requests.append(r) or script(r))
    events = run(StreamCore(CoreOptions(), SID), engine, sc.audio, lag=lag)
    assert_accounted(events, len(sc.audio))
    assert norm(final_text(events)) == norm(sc.text)
    day = sc.words[after - 1]
    [resumed] = [r for r in requests if r.stream_offset == day.end]
    assert resumed.prompt.endswith("upstairs one day")
    # the words re-read before the commit point are final at it, in order, and the Finals still tile the stream
    last = [e for e in events if isinstance(e, Final) and e.text][-1]
    assert [w.start for w in last.words] == sorted(w.start for w in last.words)


def test_without_resuming_the_words_after_an_early_stop_are_lost() -> None:
    """``resume_after_ms=0``: the closing window's audio after its last word is committed without words (what the
    core did before it resumed), which the test above would catch."""
    sc = scene(("silence", 1.0, ""), ("speech", 12.0, LONG_SENTENCE), ("silence", 1.5, ""))
    after = LONG_SENTENCE.split().index("and")
    engine = ScriptedEngine(stops_early(sc.words, after, 2 * SR))
    events = run(StreamCore(CoreOptions(resume_after_ms=0), SID), engine, sc.audio)
    assert_accounted(events, len(sc.audio))
    assert norm(final_text(events)) == norm(sc.text)[: after + 1]


def test_a_decoder_that_always_stops_early_decodes_an_utterance_a_bounded_number_of_times() -> None:
    """Wherever its window starts, the decoder writes two words and stops: the closing window is decoded again at
    most four times, each from at least 300 ms later, and then the rest is committed; every sample accounted."""
    sc = scene(("silence", 1.0, ""), ("speech", 12.0, LONG_SENTENCE), ("silence", 1.5, ""))
    requests: list[DecodeRequest] = []

    def two_words(request: DecodeRequest) -> list[Word]:
        requests.append(request)
        heard = [w for w in sc.words if w.start >= request.stream_offset]
        return heard[:2]

    events = run(StreamCore(CoreOptions(), SID), ScriptedEngine(two_words), sc.audio)
    assert_accounted(events, len(sc.audio))
    end = requests[-1].stream_offset + len(requests[-1].audio)
    starts = sorted({r.stream_offset for r in requests if r.stream_offset + len(r.audio) == end})
    assert len(starts) == 5
    assert all(b - a >= 0.3 * SR for a, b in itertools.pairwise(starts))
    heard = norm(final_text(events))
    assert not Counter(heard) - Counter(norm(sc.text))


def test_an_utterance_whose_words_end_with_its_speech_is_decoded_once_at_its_end() -> None:
    """Words that reach the utterance's end (the usual case) do not resume: the same windows as without resuming."""
    sc = scene(*TWO_UTTERANCES)
    windows = []
    for resume_after_ms in (2000, 0):
        requests: list[DecodeRequest] = []
        engine = ScriptedEngine(lambda r, requests=requests: requests.append(r) or sc.words)
        events = run(StreamCore(CoreOptions(resume_after_ms=resume_after_ms), SID), engine, sc.audio)
        assert norm(final_text(events)) == norm(sc.text)
        windows.append([(r.stream_offset, len(r.audio)) for r in requests])
    assert windows[0] == windows[1]


@pytest.mark.parametrize("like_offline", [False, True])
def test_the_window_closing_an_utterance_may_be_decoded_as_offline_decodes_one(like_offline: bool) -> None:
    """``closing_like_offline``: the last window of each utterance gets offline's encoder span and temperature
    fallback; every other window keeps the stream's options, and the transcript is the same."""
    sc = scene(*TWO_UTTERANCES)
    requests: list[DecodeRequest] = []
    engine = ScriptedEngine(lambda r: requests.append(r) or list(sc.words))
    events = run(StreamCore(CoreOptions(closing_like_offline=like_offline), SID), engine, sc.audio)
    assert norm(final_text(events)) == norm(sc.text)
    ends = {e.end for e in events if isinstance(e, SpeechEnded)}
    # the closing window is the last to end where its utterance's speech does (a step may have ended there too)
    last = {r.stream_offset + len(r.audio): r.request_id for r in requests}
    closing = {last[end] for end in ends}
    assert len(closing) == 2 and len(requests) > 2
    stream = CoreOptions().decode
    offline = (CLOSING_TEMPERATURES, CLOSING_ENCODER_PAD_SECONDS)
    for r in requests:
        expected = (
            offline if like_offline and r.request_id in closing else (stream.temperatures, stream.encoder_pad_seconds)
        )
        assert (r.options.temperatures, r.options.encoder_pad_seconds) == expected
