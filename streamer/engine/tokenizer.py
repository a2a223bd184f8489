"""Whisper's tokenizer over a Hugging Face ``tokenizer.json``: special tokens looked up by name, never hard-coded
(their ids differ between the English-only and the multilingual vocabularies), and the word splitting that word
timestamps need (after openai/whisper ``tokenizer.py``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from streamer.core.errors import ConfigError, ModelFilesError
from streamer.engine.types import Task

__all__ = ["SpecialTokens", "WhisperTokenizer"]

# Languages whose words are not separated by spaces: split on unicode boundaries instead.
_UNICODE_SPLIT_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")


@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    no_timestamps: int
    no_speech: int
    transcribe: int
    translate: int
    sot_lm: int | None
    timestamp_begin: int


class WhisperTokenizer:
    """Encode and decode Whisper tokens; build the start-of-transcript sequence for a language and task."""

    def __init__(self, path: Path, vocab_size: int) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as error:  # pragma: no cover - tokenizers ships with transformers
            raise ModelFilesError("the 'tokenizers' package is missing: pip install tokenizers") from error
        if not path.is_file():
            raise ModelFilesError(f"tokenizer file {path} is missing")
        try:
            self._tok: Any = Tokenizer.from_file(str(path))
        except Exception as error:
            raise ModelFilesError(f"{path} is not a readable tokenizer.json: {error}") from None
        self.vocab_size = vocab_size
        self.special = self._find_special()
        self.multilingual = vocab_size >= 51865
        self.language_tokens: dict[str, int] = {}
        if self.multilingual:
            for token, token_id in self._tok.get_vocab(with_added_tokens=True).items():
                match = _LANGUAGE_TOKEN.match(token)
                if match and self.special.sot < token_id < self.special.translate:
                    self.language_tokens[match.group(1)] = token_id

    def _id(self, *names: str) -> int | None:
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    def _require(self, *names: str) -> int:
        token_id = self._id(*names)
        if token_id is None:
            raise ModelFilesError(f"tokenizer.json lacks the special token {names[0]}: is this a Whisper tokenizer?")
        return token_id

    def _find_special(self) -> SpecialTokens:
        no_timestamps = self._require("<|notimestamps|>")
        return SpecialTokens(
            eot=self._require("<|endoftext|>"),
            sot=self._require("<|startoftranscript|>"),
            sot_prev=self._require("<|startofprev|>"),
            no_timestamps=no_timestamps,
            no_speech=self._require("<|nospeech|>", "<|nocaptions|>"),
            transcribe=self._require("<|transcribe|>"),
            translate=self._require("<|translate|>"),
            sot_lm=self._id("<|startoflm|>"),
            # timestamp tokens <|0.00|> .. <|30.00|> follow <|notimestamps|>; some tokenizer files omit them
            timestamp_begin=no_timestamps + 1,
        )

    def sot_sequence(self, language: str | None, task: Task) -> list[int]:
        """``<|startoftranscript|>`` [``<|lang|>`` ``<|task|>``]: the prefix every window's decoding starts from."""
        sequence = [self.special.sot]
        if self.multilingual:
            lang = language or "en"
            if lang not in self.language_tokens:
                raise ConfigError(f"language {lang!r} is not supported by this model")
            sequence.append(self.language_tokens[lang])
            sequence.append(self.special.translate if task is Task.TRANSLATE else self.special.transcribe)
        elif language not in (None, "en"):
            raise ConfigError(f"this model is English-only and cannot transcribe language {language!r}")
        elif task is Task.TRANSLATE:
            raise ConfigError("this model is English-only and cannot translate; use a multilingual model")
        return sequence

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        """Text of ``tokens``, special and timestamp tokens left out."""
        return str(self._tok.decode([t for t in tokens if t < self.special.eot], skip_special_tokens=False))

    def decode_raw(self, tokens: list[int]) -> str:
        return str(self._tok.decode(tokens, skip_special_tokens=False))

    @cached_property
    def non_speech_tokens(self) -> list[int]:
        """Tokens of symbols that are not speech (openai/whisper ``non_speech_tokens``), for suppression."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += [
            "<<",
            ">>",
            "<<<",
            ">>>",
            "--",
            "---",
            "-(",
            "-[",
            "('",
            '("',
            "((",
            "))",
            "(((",
            ")))",
            "[[",
            "]]",
            "{{",
            "}}",
            "♪♪",
            "♪♪♪",
        ]
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + list(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return sorted(result)

    def split_to_word_tokens(self, tokens: list[int], language: str) -> tuple[list[str], list[list[int]]]:
        """Group ``tokens`` into words (each with its leading space), for word-level timestamps."""
        if language in _UNICODE_SPLIT_LANGUAGES:
            return self._split_on_unicode(tokens)
        return self._split_on_spaces(tokens)

    def _split_on_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        decoded_full = self.decode_raw(tokens)
        replacement = "\ufffd"
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode_raw(current)
            if replacement not in decoded or decoded_full[offset + decoded.index(replacement)] == replacement:
                words.append(decoded)
                word_tokens.append(current)
                current = []
                offset += len(decoded)
        return words, word_tokens

    def _split_on_spaces(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        subwords, subword_tokens = self._split_on_unicode(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, sub_tokens in zip(subwords, subword_tokens, strict=True):
            special = sub_tokens[0] >= self.special.eot
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or not words:
                words.append(subword)
                word_tokens.append(list(sub_tokens))
            else:
                words[-1] += subword
                word_tokens[-1].extend(sub_tokens)
        return words, word_tokens
