from __future__ import annotations

import time

import numpy as np
import pytest

from streamer.engine.fake import FakeBehaviour, FakeEngineError, ScriptedEngine, words_from_text
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
    engine = ScriptedEngine(SCRIPT, FakeBehaviour(real_time_factor=0.1))
    t = time.monotonic()
    engine.decode([request(0, 8000), request(0, 8000)])
    assert time.monotonic() - t >= 0.09


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
