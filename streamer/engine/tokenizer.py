"""Whisper's tokenizer over a Hugging Face ``tokenizer.json``: special tokens looked up by name, never hard-coded
(their ids differ between the English-only and the multilingual vocabularies), and the word splitting that word
timestamps need (after openai/whisper ``tokenizer.py``).

Decoding needs the vocabulary alone; encoding needs the BPE merges too, and building them is most of what loading a
``tokenizer.json`` costs (0.15 to 0.2 s of a 4 s ``streamer transcribe`` of one file on 2 cores, holding the GIL, so
no thread can hide it). A one-file command that is given no prompt never encodes. So the tokenizer decodes from a
decode-only copy of the file, with the BPE model swapped for a word-level one over the same vocabulary (the same
added tokens and the same byte-level decoder: the same text for every token sequence), which loads in a third of the
time, and loads the whole file the first time it encodes (:meth:`WhisperTokenizer.load_encoder`; a server's warm-up
calls it). The copy is written once per ``tokenizer.json`` under ``cache_root()/tokenizers/``, named by the file's
path, size and modification time, the ``tokenizers`` version and :data:`TABLE_FORMAT`: written to a temporary name
and renamed into place, rebuilt when unreadable, and skipped (the whole file loaded) when it cannot be written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import string
import tempfile
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from streamer.core.errors import ConfigError, ModelFilesError
from streamer.engine.types import Task

__all__ = ["TABLE_FORMAT", "SpecialTokens", "WhisperTokenizer", "decoding_table", "table_file"]

log = logging.getLogger(__name__)

# bump when what a decode-only copy holds changes: every older copy is then ignored
TABLE_FORMAT = "1"

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

    def __init__(self, path: Path, vocab_size: int, *, cache: bool = True) -> None:
        """``cache``: decode from the decode-only copy under ``cache_root()/tokenizers/`` (written on the first
        load), the whole file loaded on the first :meth:`encode`; False: load the whole file now, write nothing."""
        if importlib.util.find_spec("tokenizers") is None:  # pragma: no cover - tokenizers ships with transformers
            raise ModelFilesError("the 'tokenizers' package is missing: pip install tokenizers")
        if not path.is_file():
            raise ModelFilesError(f"tokenizer file {path} is missing")
        self._path = path
        self._encoder: Any = None  # the whole tokenizer (BPE merges included), once loaded
        self._encoder_lock = threading.Lock()
        self._tok: Any = _read_table(table_file(path)) if cache else None  # decodes; looks up ids
        if self._tok is None:
            self._tok = self.load_encoder()
            if cache:
                _write_table(table_file(path), path)
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

    def load_encoder(self) -> Any:
        """The whole tokenizer, loaded from ``tokenizer.json`` on the first call (thread-safe): what encoding needs."""
        with self._encoder_lock:
            if self._encoder is None:
                from tokenizers import Tokenizer

                try:
                    self._encoder = Tokenizer.from_file(str(self._path))
                except Exception as error:
                    raise ModelFilesError(f"{self._path} is not a readable tokenizer.json: {error}") from None
            return self._encoder

    def encode(self, text: str) -> list[int]:
        return list(self.load_encoder().encode(text, add_special_tokens=False).ids)

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
        """Pieces that decode to whole characters. A piece ends at a token after which its text has no replacement
        character that the whole text lacks. A sequence that does not start or end on a character boundary (a
        window's tokens can be anything) still gives every token to a piece: the last piece takes what is left,
        and a replacement character past the end of the whole text ends its piece (openai/whisper raised
        IndexError there and dropped the tokens of an unfinished last piece)."""
        decoded_full = self.decode_raw(tokens)
        replacement = "\ufffd"
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode_raw(current)
            at = offset + decoded.find(replacement)
            if replacement not in decoded or at >= len(decoded_full) or decoded_full[at] == replacement:
                words.append(decoded)
                word_tokens.append(current)
                current = []
                offset += len(decoded)
        if current:
            words.append(self.decode_raw(current))
            word_tokens.append(current)
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


def table_file(path: Path) -> Path:
    """Where the decode-only copy of the ``tokenizer.json`` at ``path`` is cached on this machine."""
    import tokenizers

    from streamer.engine.models import cache_root

    stat = path.stat()
    identity = f"{TABLE_FORMAT}\n{tokenizers.__version__}\n{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n"
    return cache_root() / "tokenizers" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"


def decoding_table(text: str) -> str | None:
    """The decode-only copy of a ``tokenizer.json`` (its text): a BPE model swapped for a word-level one over the
    same vocabulary, everything else (added tokens, decoder) as it is. None for another kind of model, which is
    then always loaded whole."""
    document = json.loads(text)
    model = document.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return None
    unknown = model.get("unk_token") or next(iter(model["vocab"]))  # WordLevel needs one; decoding never uses it
    document["model"] = {"type": "WordLevel", "vocab": model["vocab"], "unk_token": unknown}
    return json.dumps(document, ensure_ascii=False)


def _read_table(table: Path) -> Any:
    """The decode-only tokenizer cached at ``table``; None when there is none, or (logged) when it is unreadable."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(table))
    except Exception as error:  # missing (the usual first load), truncated or foreign
        if table.exists():
            log.warning("ignoring the tokenizer cache %s, which cannot be read (%s); rebuilding it", table, error)
        return None


def _write_table(table: Path, source: Path) -> None:
    """Cache the decode-only copy of ``source`` at ``table`` atomically; a failure is logged, not raised."""
    try:
        text = decoding_table(source.read_text(encoding="utf-8"))
        if text is None:
            return
        table.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=table.parent, prefix=table.name, suffix=".tmp", delete=False
        ) as file:
            temporary = Path(file.name)
            try:
                file.write(text)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        os.replace(temporary, table)
    except (OSError, ValueError) as error:
        log.warning("cannot write the tokenizer cache %s (%s): the next load reads the whole file", table, error)
