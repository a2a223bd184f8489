from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf

from streamer.core.errors import ConfigError, InvalidState
from streamer.core.vad import SpeechEnd, VadEvent, VadOptions, VadSpan, VoiceActivityDetector
from streamer.engine.fake import synthetic_silence, synthetic_voice

SR = 16000
HERE = Path(__file__).parent.parent / "data"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared speech data not found at {SHARED}")


def load(path: Path) -> npt.NDArray[np.float32]:
    x, rate = sf.read(path, dtype="float32", always_2d=True)
    assert rate == SR
    return np.asarray(x[:, 0], dtype=np.float32)


def label(x: npt.NDArray[np.float32], chunk: int = 4321, options: VadOptions | None = None) -> list[VadEvent]:
    vad = VoiceActivityDetector(options)
    events: list[VadEvent] = []
    for i in range(0, len(x), chunk):
        events += vad.process(x[i : i + chunk])
    events += vad.flush()
    spans = [e for e in events if isinstance(e, VadSpan)]
    # every sample is labelled exactly once, in order
    assert spans[0].start == 0 and spans[-1].end == len(x)
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    return events


def speech_fraction(events: list[VadEvent], total: int) -> float:
    return sum(e.end - e.start for e in events if isinstance(e, VadSpan) and e.speech) / total


def test_synthetic_speech_is_found_with_padding() -> None:
    x = np.concatenate([synthetic_silence(2 * SR), synthetic_voice(3 * SR), synthetic_silence(2 * SR)])
    events = label(x)
    speech = [e for e in events if isinstance(e, VadSpan) and e.speech]
    ends = [e for e in events if isinstance(e, SpeechEnd)]
    assert len(ends) == 1
    start, end = speech[0].start, speech[-1].end
    # padded by pad_before / pad_after (300 ms) around the 2..5 s voice, within a frame or two
    assert 2 * SR - 6000 <= start <= 2 * SR - 3600
    assert 5 * SR + 2400 <= end <= 5 * SR + 6000
    assert ends[0].position == end


def test_chunking_does_not_change_the_labels() -> None:
    x = np.concatenate([synthetic_silence(SR), synthetic_voice(2 * SR), synthetic_silence(SR), synthetic_voice(SR)])

    def spans(chunk: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for e in label(x, chunk):
            if isinstance(e, VadSpan) and e.speech:
                if out and out[-1][1] == e.start:
                    out[-1] = (out[-1][0], e.end)
                else:
                    out.append((e.start, e.end))
        return out

    assert spans(1) == spans(480) == spans(100000)


def test_a_short_pause_does_not_end_speech() -> None:
    x = np.concatenate([synthetic_voice(SR), synthetic_silence(SR // 5), synthetic_voice(SR), synthetic_silence(SR)])
    assert sum(isinstance(e, SpeechEnd) for e in label(x)) == 1


def test_silence_has_no_speech_and_flush_labels_the_trailing_partial_frame() -> None:
    x = synthetic_silence(SR + 7)
    events = label(x, chunk=333)
    assert speech_fraction(events, len(x)) == 0.0


def test_wrong_use() -> None:
    vad = VoiceActivityDetector()
    vad.flush()
    with pytest.raises(InvalidState):
        vad.process(np.zeros(10, dtype=np.float32))
    with pytest.raises(ConfigError):
        VoiceActivityDetector(VadOptions(frame_ms=25))


def test_speech_in_the_bundled_librispeech_clip() -> None:
    x = load(HERE / "1089-134686-0001.flac")
    assert speech_fraction(label(x), len(x)) > 0.8


@needs_shared
@pytest.mark.parametrize("path", sorted((SHARED / "librispeech").glob("test-*/*/*/*.flac"))[::7], ids=lambda p: p.name)
def test_speech_in_librispeech(path: Path) -> None:
    x = load(path)
    assert speech_fraction(label(x), len(x)) > 0.75


@needs_shared
@pytest.mark.parametrize(
    ("name", "most"),
    [
        ("synthetic_silence_16k_10s.wav", 0.0),
        ("synthetic_white_noise_16k_10s.wav", 0.0),
        ("synthetic_pink_noise_16k_10s.wav", 0.0),
        ("picovoice_empty.wav", 0.02),  # room noise
        ("speech_commands_doing_the_dishes.wav", 0.15),  # clattering dishes: a few transients get through
        # guitar_16k.wav is left out on purpose: webrtcvad takes music for speech (see streamer/core/vad.py)
    ],
)
def test_little_or_no_speech_in_nonspeech(name: str, most: float) -> None:
    x = load(SHARED / "nonspeech" / name)
    assert speech_fraction(label(x), len(x)) <= most
