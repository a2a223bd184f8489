from __future__ import annotations

import pytest

from streamer.core import requests
from streamer.core.errors import UnsupportedAudio
from streamer.engine import types
from streamer.engine.types import WHISPER_LANGUAGES, EngineInfo, Task, check_supported

TINY_EN = EngineInfo(model="tiny.en", multilingual=False, encoder="int8/cpu", decoder="fp32/cpu")
BASE = EngineInfo(model="base", multilingual=True, encoder="int8/cpu", decoder="fp32/cpu")


def test_languages_default_to_english_alone_or_whisper_s_hundred() -> None:
    assert TINY_EN.languages == {"en"} and not TINY_EN.can_translate
    assert BASE.languages == WHISPER_LANGUAGES and len(WHISPER_LANGUAGES) == 100 and BASE.can_translate
    listed = EngineInfo("m", multilingual=True, encoder="e", decoder="d", languages=frozenset({"en", "de"}))
    assert listed.languages == {"en", "de"}


@pytest.mark.parametrize(
    ("info", "language", "task", "reason"),
    [
        (TINY_EN, "xx", Task.TRANSCRIBE, "language 'xx' is not supported by tiny.en"),
        (TINY_EN, "de", Task.TRANSCRIBE, "language 'de' is not supported by tiny.en (English-only model)"),
        (TINY_EN, None, Task.TRANSLATE, "task 'translate' is not supported by tiny.en (English-only model)"),
        (BASE, "xx", Task.TRANSCRIBE, "language 'xx' is not supported by base"),
    ],
)
def test_what_the_model_cannot_serve_is_refused_with_4415_and_the_reason(
    info: EngineInfo, language: str | None, task: Task, reason: str
) -> None:
    with pytest.raises(UnsupportedAudio) as refused:
        check_supported(info, language, task)
    assert refused.value.message == reason
    assert (refused.value.code, refused.value.close_code) == ("unsupported_audio", 4415)


@pytest.mark.parametrize(
    ("info", "language", "task"),
    [
        (TINY_EN, None, Task.TRANSCRIBE),
        (TINY_EN, "en", Task.TRANSCRIBE),
        (BASE, None, Task.TRANSCRIBE),
        (BASE, "de", Task.TRANSLATE),
        (BASE, "yue", Task.TRANSCRIBE),
    ],
)
def test_what_the_model_can_serve_passes(info: EngineInfo, language: str | None, task: Task) -> None:
    check_supported(info, language, task)


def test_the_core_s_records_are_still_importable_from_here() -> None:
    # they moved to streamer.core.requests (issue 38: the core imports nothing from the engine); every caller's
    # ``from streamer.engine.types import DecodeOptions`` gets the very same objects
    for name in requests.__all__:
        if name != "AudioArray":
            assert name in types.__all__ and getattr(types, name) is getattr(requests, name)
