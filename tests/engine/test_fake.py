from __future__ import annotations

import numpy as np
import pytest

from streamer.core.errors import ConfigError
from streamer.engine.fake import (
    STEADY_LENGTH,
    STEADY_PERIOD,
    STEADY_WORDS,
    FakeBehaviour,
    FakeEngineError,
    ScriptedCost,
    ScriptedEngine,
    SteadyScript,
    scripted_engine,
    words_from_text,
)
from streamer.engine.types import DecodeOptions, DecodeRequest, Engine, EngineInfo, StreamId

SID = StreamId("a")
SCRIPT = words_from_text("one two three four", start=1000, word_samples=4000, gap_samples=1000)


def request(start: int, end: int, rid: int = 1) -> DecodeRequest:
    return DecodeRequest(np.zeros(end - start, dtype=np.float32), stream_id=SID, stream_offset=start, request_id=rid)


def test_implements_the_engine_protocol() -> None:
    engine = ScriptedEngine({SID: SCRIPT})
    assert isinstance(engine, Engine)
    engine.forget_stream(SID)
    engine.close()
    assert engine.forgotten == [SID] and engine.closed


def test_returns_words_inside_the_window_relative_to_it() -> None:
    engine = ScriptedEngine({SID: SCRIPT})
    [result] = engine.decode([request(5000, 16000, rid=7)])
    assert result.request_id == 7
    assert [w.word for w in result.words] == [" two", " three"]
    assert result.words[0].start == 6000 - 5000
    assert result.text == " two three"
    assert engine.calls == 1 and engine.requests == 1


def test_function_script_and_unknown_streams() -> None:
    engine = ScriptedEngine(lambda r: SCRIPT[:1])
    assert engine.decode([request(0, 20000)])[0].text == " one"
    assert ScriptedEngine({}).decode([request(0, 20000)])[0].text == ""


def test_behaviours() -> None:
    unstable = ScriptedEngine(SCRIPT, FakeBehaviour(unstable_last_word=True))
    a, b = (unstable.decode([request(0, 30000)])[0].words[-1].word for _ in range(2))
    assert a != b
    silent = ScriptedEngine(SCRIPT, FakeBehaviour(no_speech_calls=frozenset({1})))
    first = silent.decode([request(0, 30000)])[0]
    assert first.text == "" and first.no_speech_prob > 0.6
    assert silent.decode([request(0, 30000)])[0].text
    looping = ScriptedEngine(SCRIPT, FakeBehaviour(always_loop=True))
    assert looping.decode([request(0, 30000)])[0].text.endswith("thank you thank you")
    failing = ScriptedEngine(SCRIPT, FakeBehaviour(fail_calls=frozenset({2})))
    failing.decode([request(0, 100)])
    with pytest.raises(FakeEngineError):
        failing.decode([request(0, 100)])


def test_real_time_factor_sleeps_in_proportion() -> None:
    slept: list[float] = []
    engine = ScriptedEngine(SCRIPT, FakeBehaviour(real_time_factor=0.1), sleep=slept.append)
    engine.decode([request(0, 8000), request(0, 8000)])
    assert slept == [pytest.approx(0.1)]  # 0.1 s per second of audio, over both windows of the call


def test_a_call_sleeps_its_batch_cost_plus_each_window_cost_and_nothing_without_a_cost() -> None:
    slept: list[float] = []
    behaviour = FakeBehaviour(window_seconds=0.002, batch_seconds=0.005, real_time_factor=0.01)
    engine = ScriptedEngine(SCRIPT, behaviour, sleep=slept.append)
    engine.decode([request(0, 16000), request(0, 16000), request(0, 16000)])
    engine.decode([request(0, 16000)])
    assert slept == [pytest.approx(0.005 + 3 * 0.002 + 0.03), pytest.approx(0.005 + 0.002 + 0.01)]
    free = ScriptedEngine(SCRIPT, sleep=slept.append)
    free.decode([request(0, 16000)])
    assert len(slept) == 2


def test_the_steady_script_gives_any_window_fixed_words_every_period() -> None:
    script = SteadyScript()
    assert (STEADY_PERIOD, STEADY_LENGTH) == (5600, 4000)  # 0.35 s apart, 0.25 s long
    words = script(request(0, 16000 * 3))
    assert [w.start for w in words] == [k * 5600 for k in range(8)]  # 8 words end within 3 s: the 8th at 2.7 s
    assert [w.text for w in words[:3]] == list(STEADY_WORDS[:3])
    # a later, overlapping window: the words wholly inside it, the same words at the same stream times
    later = script(request(5000, 20000))
    assert [(w.text, w.start, w.end) for w in later] == [
        (w.text, w.start, w.end) for w in words if w.start >= 5000 and w.end <= 20000
    ]
    assert later[-1].end <= 20000
    assert script(request(5601, 5601 + 3999)) == []  # shorter than a word after the first start: none
    far = script(request(16000 * 3600, 16000 * 3601))  # an hour in: still words, the vocabulary cycling
    assert len(far) >= 2 and {w.text for w in far} <= set(STEADY_WORDS)


def test_the_scripted_engine_of_serve_answers_any_audio_at_its_cost() -> None:
    slept: list[float] = []
    engine = scripted_engine(ScriptedCost(window_ms=3, batch_ms=5), sleep=slept.append)
    assert engine.info.model == "scripted" and isinstance(engine, Engine)
    first, second = engine.decode([request(0, 16000), request(16000, 32000, rid=2)])
    assert first.text == " alpha bravo charlie" and second.request_id == 2 and second.words
    assert slept == [pytest.approx(0.005 + 2 * 0.003)]


@pytest.mark.parametrize("cost", [ScriptedCost(window_ms=-1), ScriptedCost(batch_ms=float("nan"))])
def test_a_scripted_cost_out_of_range_is_refused(cost: ScriptedCost) -> None:
    with pytest.raises(ConfigError, match="_ms must be between 0 and 60000"):
        scripted_engine(cost)


def test_reports_an_english_only_model_and_fails_a_batch_holding_another_language_like_the_real_engine() -> None:
    engine = ScriptedEngine(SCRIPT)
    assert engine.info.languages == {"en"} and not engine.info.multilingual and not engine.info.can_translate
    english = request(0, 30000, rid=1)
    german = DecodeRequest(english.audio, DecodeOptions(language="de"), stream_id=StreamId("b"), request_id=2)
    assert engine.decode([english])[0].text == " one two three four"
    with pytest.raises(FakeEngineError, match="cannot decode language 'de'"):
        engine.decode([english, german])  # one bad window fails the whole batch


def test_info_can_be_given_and_a_claimed_language_can_still_fail() -> None:
    info = EngineInfo("tiny", multilingual=True, encoder="fake", decoder="fake", languages=frozenset({"en", "de"}))
    engine = ScriptedEngine(SCRIPT, FakeBehaviour(fail_languages=frozenset({"de"})), info=info)
    assert engine.info is info
    french = DecodeRequest(np.zeros(100, dtype=np.float32), DecodeOptions(language="fr"))
    german = DecodeRequest(np.zeros(100, dtype=np.float32), DecodeOptions(language="de"))
    for bad in (french, german):  # fr: not among its languages; de: claimed, but it fails on it
        with pytest.raises(FakeEngineError):
            engine.decode([request(0, 100), bad])
