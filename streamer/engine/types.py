"""The engine's narrow interface: what goes in, what comes out. No torch here.

Call :meth:`Engine.decode` from one worker thread (never the event loop): it blocks for the whole batch. Everything
about the model -- the KV cache, the quantized encoder, device placement -- stays behind it. The records a decode
takes and gives (:class:`DecodeRequest`, :class:`DecodeResult`, ...) are the core's (:mod:`streamer.core.requests`),
re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from streamer.core.requests import (
    KEYWORD_BONUS,
    MAX_INITIAL_PROMPT_CHARS,
    MAX_KEYWORD_BONUS,
    MAX_KEYWORD_CHARS,
    MAX_KEYWORDS,
    MIN_ENCODER_PAD_SECONDS,
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    SegmentResult,
    StageTimings,
    StreamId,
    Task,
    WordTiming,
)

__all__ = [
    "KEYWORD_BONUS",
    "MAX_INITIAL_PROMPT_CHARS",
    "MAX_KEYWORDS",
    "MAX_KEYWORD_BONUS",
    "MAX_KEYWORD_CHARS",
    "MIN_ENCODER_PAD_SECONDS",
    "WHISPER_LANGUAGES",
    "DecodeOptions",
    "DecodeRequest",
    "DecodeResult",
    "Engine",
    "EngineInfo",
    "SegmentResult",
    "StageTimings",
    "StreamId",
    "Task",
    "WordTiming",
    "check_supported",
]

# The language codes Whisper's multilingual models were trained on: the keys of openai/whisper ``tokenizer.py``
# LANGUAGES (100 codes, "yue" added with large-v3). A model's tokenizer has a ``<|code|>`` token for each it knows.
WHISPER_LANGUAGES = frozenset(
    {
        "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
        "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
        "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
        "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
        "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
        "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha",
        "ba", "jw", "su", "yue",
    }
)  # fmt: skip


@dataclass(frozen=True)
class EngineInfo:
    """What a client or a log should know about the loaded model."""

    model: str  # the name the user asked for, e.g. "tiny.en"
    multilingual: bool
    encoder: str  # e.g. "int8/cpu"
    decoder: str  # e.g. "fp32/cpu"
    # ISO 639-1 codes the model can transcribe: a multilingual model's language tokens, {"en"} for an English-only
    # one; left empty, it is filled from ``multilingual`` (Whisper's codes, or "en" alone)
    languages: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.languages:
            object.__setattr__(self, "languages", WHISPER_LANGUAGES if self.multilingual else frozenset({"en"}))

    @property
    def can_translate(self) -> bool:
        """Whether the model can translate into English: multilingual Whisper models have the ``<|translate|>``
        task token; English-only ones have no task tokens at all."""
        return self.multilingual


def check_supported(info: EngineInfo, language: str | None, task: Task = Task.TRANSCRIBE) -> None:
    """Refuse what the loaded model cannot serve, before any audio is accepted for it.

    Call where a client's parameters become decode options (``/v1/listen``'s query, a realtime ``session.update``):
    otherwise the engine raises on the first batch holding such a window and, until the scheduler isolated it, took
    the other streams of that batch with it (issue 14, finding 2). ``language`` None means "detect" (multilingual)
    or "en" (English-only) and is always served. Raises :class:`~streamer.core.errors.UnsupportedAudio` (close 4415,
    like any bad connect parameter) whose message is the reason; an adapter with its own error type re-raises it.
    """
    from streamer.core.errors import UnsupportedAudio

    english_only = "" if info.multilingual else " (English-only model)"
    if language is not None and language not in info.languages:
        known = language in WHISPER_LANGUAGES
        raise UnsupportedAudio(f"language {language!r} is not supported by {info.model}{english_only if known else ''}")
    if task is Task.TRANSLATE and not info.can_translate:
        raise UnsupportedAudio(f"task {task.value!r} is not supported by {info.model}{english_only}")


@runtime_checkable
class Engine(Protocol):
    """A loaded, warmed-up model. Implementations: :class:`streamer.engine.whisper.WhisperEngine` and the fake."""

    @property
    def info(self) -> EngineInfo: ...

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        """Decode a batch; blocks. Results come back in request order. Call from one worker thread only."""
        ...

    def forget_stream(self, stream_id: StreamId) -> None:
        """Drop any per-stream state (call when a stream ends)."""
        ...

    def close(self) -> None:
        """Release the model; no call may follow."""
        ...
