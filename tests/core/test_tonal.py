"""Steady tones are not speech (issue 16): the tone detector flags telephone tones frame by frame, the VAD built on
it labels none of them speech, and real speech keeps its labels."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from streamer.bench.nonspeech import KINDS, generate
from streamer.core.errors import ConfigError
from streamer.core.tonal import ToneDetector, ToneOptions
from streamer.core.vad import FrameClassifier, VadOptions, VadSpan, VoiceActivityDetector
from streamer.offline.audiofile import load_audio
from tests.conftest import SHARED_DATA, load_clip

SR = 16000
FRAME = 480  # the VAD's 30 ms frame
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared speech data not found at {SHARED_DATA}")
Audio = npt.NDArray[np.float32]


def tones(seconds: float, *freqs: float, level_dbfs: float = -20.0, seed: int = 0) -> Audio:
    """Sinusoids of equal amplitude at ``level_dbfs`` RMS in all, over a -80 dBFS noise floor."""
    t = np.arange(int(seconds * SR)) / SR
    x = sum((np.sin(2 * np.pi * f * t) for f in freqs), np.zeros_like(t))
    x *= 10 ** (level_dbfs / 20) / np.sqrt(np.mean(x**2))
    return (x + 1e-4 * np.random.default_rng(seed).standard_normal(t.size)).astype(np.float32)


def flagged(x: Audio) -> float:
    """The share of the frames the detector calls a tone."""
    detector = ToneDetector()
    frames = x[: x.size // FRAME * FRAME].reshape(-1, FRAME)
    return float(np.mean([detector.is_tone(f) for f in frames]))


def speech_mask(
    x: Audio, options: VadOptions | None = None, classifier: FrameClassifier | None = None
) -> npt.NDArray[np.bool_]:
    vad = VoiceActivityDetector(options, classifier)
    events = [e for i in range(0, x.size, 1600) for e in vad.process(x[i : i + 1600])] + vad.flush()
    mask = np.zeros(x.size, dtype=bool)
    for e in events:
        if isinstance(e, VadSpan) and e.speech:
            mask[e.start : e.end] = True
    return mask


WITHOUT = VadOptions(reject_tones=False, reject_music=False)  # the music detector takes held tones too (issue 39)

# call-progress, fax and test tones (frequencies in Hz; ITU-T E.180 and T.30)
SIGNALS = {
    "US dial tone": (350.0, 440.0),
    "US ringback": (440.0, 480.0),
    "US busy": (480.0, 620.0),
    "UK ringback": (400.0, 450.0),
    "European dial tone": (425.0,),
    "fax calling tone CNG": (1100.0,),
    "fax answer tone CED": (2100.0,),
    "1 kHz test tone": (1004.0,),
}


@pytest.mark.parametrize("name", SIGNALS)
@pytest.mark.parametrize("level", [-40.0, -19.0, -6.0])
def test_steady_tones_are_never_speech(name: str, level: float) -> None:
    # three seconds of tone between two seconds of line noise, as a call meets it
    x = np.concatenate([tones(2.0, 100.0, level_dbfs=-90), tones(3.0, *SIGNALS[name], level_dbfs=level)])
    x = np.concatenate([x, tones(2.0, 100.0, level_dbfs=-90, seed=1)])
    assert speech_mask(x, WITHOUT).any()  # webrtcvad and the energy gate alone take these for speech
    assert not speech_mask(x).any()
    # every frame of the tone is flagged but the first two (one straddles the onset, the next has no steady past)
    assert flagged(x[2 * SR : 5 * SR]) == pytest.approx(1 - 2 / 100)


@pytest.mark.parametrize(
    ("kind", "level"), [("ringback", -30.0), ("ringback", -19.0), ("dtmf", -20.0), ("dtmf", -10.0)]
)
def test_generated_ringback_and_dtmf_are_never_speech(kind: str, level: float) -> None:
    for seed in range(4):  # both ringback cadences, and many digit lengths and gaps
        x = generate(kind, 30.0, level, seed).samples
        assert speech_mask(x, WITHOUT).mean() > 0.3
        assert not speech_mask(x).any(), f"{kind} {level} #{seed}"


def test_every_dtmf_digit_at_the_shortest_timing_is_caught() -> None:
    # Q.24: digits of 40 ms and more, 40 ms apart, must be received; dialled that fast no key becomes speech
    lows, highs = (697.0, 770.0, 852.0, 941.0), (1209.0, 1336.0, 1477.0, 1633.0)
    keys = [(low, high) for low in lows for high in highs]  # all 16 keys, 1 to D
    gap = tones(0.04, 100.0, level_dbfs=-90)
    x = np.concatenate([np.concatenate([tones(0.04, *key, level_dbfs=-15, seed=i), gap]) for i, key in enumerate(keys)])
    x = np.concatenate([x, x])  # 32 digits in 2.6 s
    assert speech_mask(x, WITHOUT).mean() > 0.5
    assert not speech_mask(x).any()


class AllVoiced:
    """A frame classifier that calls every frame voiced, of Silero's frame size: what is left is the tone detector."""

    frame_samples = 512

    def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        return np.ones(len(frames), dtype=np.bool_)


def test_the_tone_detector_works_under_any_frame_classifier() -> None:
    # US ringback, 2 s on and 4 s off, twice; this classifier voices the line noise between rings too
    on = np.concatenate([np.ones(2 * SR, dtype=bool), np.zeros(4 * SR, dtype=bool)] * 2)
    ring = np.where(on, tones(12.0, 440.0, 480.0, level_dbfs=-19), tones(12.0, 100.0, level_dbfs=-70, seed=1))
    # without the energy gate (webrtc's alone, which a steady level defeats after its first seconds anyway)
    ungated = VadOptions(energy_gate_db=None, pad_before_ms=300, pad_after_ms=300, reject_music=False)
    for options, rejecting in ((replace(ungated, reject_tones=False), False), (ungated, True)):
        mask = speech_mask(ring, options, AllVoiced())
        assert mask[~on].all()  # the classifier's verdict stands where there is no tone
        # the rings are all speech without the tone detector; with it, only the paddings of the speech around them
        # reach in (300 ms each side, and the hangover of a ring's first two frames: 23% of the ring time)
        assert mask[on].mean() < 0.25 if rejecting else mask[on].all()


def test_silence_and_noise_are_not_tones() -> None:
    assert flagged(np.zeros(SR, dtype=np.float32)) == 0.0
    rng = np.random.default_rng(0)
    assert flagged((0.05 * rng.standard_normal(3 * SR)).astype(np.float32)) == 0.0


def test_frame_size_does_not_matter() -> None:
    # the detector keeps its own window of recent audio: frames of 10, 20 or 30 ms give the same verdicts per time
    x = tones(2.0, 440.0, 480.0)
    for frame in (160, 320):
        detector = ToneDetector()
        verdicts = [detector.is_tone(f) for f in x[: x.size // frame * frame].reshape(-1, frame)]
        assert np.mean(verdicts[SR // frame :]) == 1.0


def test_options_are_checked() -> None:
    for bad in (ToneOptions(min_share=0.2), ToneOptions(max_drift_bins=9), ToneOptions(min_dtmf_share=1.5)):
        with pytest.raises(ConfigError):
            ToneDetector(bad)


# ---------------------------------------------------------------------------------------------------------------------
# Real speech keeps its labels


def test_speech_in_the_bundled_clip_keeps_its_labels() -> None:
    x = load_clip("1089-134686-0001.flac")
    before, after = speech_mask(x, WITHOUT), speech_mask(x)
    assert before.mean() > 0.8
    assert np.array_equal(before, after)


@dataclass(frozen=True)
class Kept:
    reference: int  # samples labelled speech without the tone detector
    kept: int  # ... of which still labelled speech with it


def shared_speech(folder: str, pattern: str) -> list[Path]:
    """The audio files of a shared data folder that match ``pattern``."""
    return [p for p in sorted((SHARED_DATA / folder).glob(pattern)) if p.suffix in (".wav", ".flac", ".mp3")]


def kept(paths: list[Path], without: VadOptions = WITHOUT) -> Kept:
    """Speech labels of ``paths`` without a detector (``without``) kept by the VAD with every one."""
    reference = both = 0
    for path in paths:
        x = load_audio(path).samples
        before, after = speech_mask(x, without), speech_mask(x)
        reference += int(before.sum())
        both += int((before & after).sum())
    return Kept(reference, both)


@needs_shared
@pytest.mark.parametrize(
    ("folder", "pattern", "most_lost"),
    [
        # measured: 0 of 453 s lost (LibriSpeech test-clean and test-other, 66 utterances)
        ("librispeech", "test-*/*/*/*.flac", 0.002),
        # 0.3 of 458 s lost (the start of a German sentence); 0.4 of 140 s (two Harvard-sentence starts, 8 kHz)
        ("longform", "*.*[a-z0-9]", 0.005),
        ("telephony", "*.wav", 0.01),
        # 0 of 47 s and 0 of 72 s
        ("conversation", "*.wav", 0.002),
        ("english_misc", "*.wav", 0.002),
    ],
)
def test_real_speech_keeps_its_labels(folder: str, pattern: str, most_lost: float) -> None:
    result = kept(shared_speech(folder, pattern))
    assert result.reference > 40 * SR  # enough speech that one unlucky frame cannot decide the test
    assert result.kept / result.reference >= 1 - most_lost


@needs_shared
def test_shared_nonspeech_recordings_are_not_tones() -> None:
    # room noise and dishes are not steady tones (the guitar is music, which this detector does not claim to catch)
    for name in ("picovoice_empty.wav", "speech_commands_doing_the_dishes.wav"):
        x = load_audio(SHARED_DATA / "nonspeech" / name).samples
        assert flagged(x) == 0.0, name


# ---------------------------------------------------------------------------------------------------------------------
# A chunk's frames at once give the verdicts of a frame at a time (issue 37)


class FrameByFrame:
    """The detector as it was before issue 37, one frame per call: the reference the batched one must equal."""

    def __init__(self) -> None:
        self.options = ToneOptions()
        self.window = np.hanning(1024)
        self.short_window = np.concatenate([np.zeros(512), np.hanning(512)])
        freqs = np.fft.rfftfreq(1024, 1 / SR)
        self.band = slice(int(np.searchsorted(freqs, 80.0)), int(np.searchsorted(freqs, 4000.0)) + 1)
        self.band_hz = freqs[self.band]
        self.recent = np.zeros(1024)
        self.previous: tuple[int, ...] = ()

    def is_tone(self, frame: Audio) -> bool:
        x = np.asarray(frame, dtype=np.float64).reshape(-1)[-1024:]
        self.recent = np.concatenate([self.recent[x.size :], x])
        if float(np.mean(self.recent[-512:] ** 2)) < 1e-9:
            self.previous = ()
            return False
        band = self.band_power(self.window)
        peaks = pure_peaks(band, 3, self.options.min_share)
        drift = self.options.max_drift_bins
        steady = bool(peaks) and len(peaks) == len(self.previous)
        steady = steady and all(abs(a - b) <= drift for a, b in zip(peaks, self.previous, strict=True))
        self.previous = peaks
        return steady or (is_dtmf_hz(float(self.band_hz[int(np.argmax(band))])) and self.is_dtmf())

    def band_power(self, window: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        spectrum: npt.NDArray[np.float64] = np.abs(np.fft.rfft(self.recent * window)) ** 2
        return spectrum[self.band]

    def is_dtmf(self) -> bool:
        peaks = pure_peaks(self.band_power(self.short_window), 6, self.options.min_dtmf_share)
        if len(peaks) != 2:
            return False
        low, high = (float(self.band_hz[k]) for k in peaks)
        return near(low, DTMF_LOW) and near(high, DTMF_HIGH)


DTMF_LOW, DTMF_HIGH = (697.0, 770.0, 852.0, 941.0), (1209.0, 1336.0, 1477.0, 1633.0)


def near(hz: float, nominal: tuple[float, ...]) -> bool:
    return any(abs(hz - f) <= 0.025 * f for f in nominal)


def is_dtmf_hz(hz: float) -> bool:
    return near(hz, DTMF_LOW) or near(hz, DTMF_HIGH)


def pure_peaks(band: npt.NDArray[np.float64], lobe_bins: int, share: float) -> tuple[int, ...]:
    rest = band.copy()
    total = float(rest.sum())
    if total <= 0.0:
        return ()
    held = 0.0
    peaks: list[int] = []
    for _ in range(2):
        k = int(np.argmax(rest))
        lobe = slice(max(0, k - lobe_bins), k + lobe_bins + 1)
        held += float(rest[lobe].sum())
        rest[lobe] = 0.0
        peaks.append(k)
        if held >= share * total:
            return tuple(sorted(peaks))
    return ()


def varied_audio() -> dict[str, Audio]:
    """Speech, every kind of generated non-speech at every level (tones, noise, hum, clicks, silence), and tones whose
    peaks sit at the band's edges (lobes cut short)."""
    rng = np.random.default_rng(7)
    clips = {name: load_clip(name) for name in ("1089-134686-0000.flac", "1089-134686-0001.flac")}
    for kind, (_, levels) in KINDS.items():
        for level in levels:
            clips[f"{kind} {level}"] = generate(kind, 12.0, level, seed=1).samples
    clips["edges"] = np.concatenate([tones(1.0, 85.0), tones(1.0, 3990.0, 700.0), tones(1.0, 90.0, 1336.0)])
    clips["noise"] = (0.1 * rng.standard_normal(3 * SR)).astype(np.float32)
    clips["silence"] = np.zeros(SR, dtype=np.float32)
    return clips


@pytest.mark.parametrize(("frame", "per_call"), [(480, 3), (480, 4), (480, 1), (512, 3), (160, 10), (2000, 2)])
def test_a_chunk_at_once_gives_the_verdicts_of_a_frame_at_a_time(frame: int, per_call: int) -> None:
    flagged_somewhere = 0
    for name, x in varied_audio().items():
        frames = x[: x.size // frame * frame].reshape(-1, frame)
        reference = FrameByFrame()
        expected = np.array([reference.is_tone(f) for f in frames])
        batched = ToneDetector()
        got = np.concatenate([batched.tones(frames[i : i + per_call]) for i in range(0, len(frames), per_call)])
        assert np.array_equal(got, expected), f"{name}: frames {np.flatnonzero(got != expected)[:5]} differ"
        flagged_somewhere += int(expected.any())
    assert flagged_somewhere >= 4  # the set holds tones (DTMF, ringback, hum, the edge tones), not only speech


def test_an_empty_chunk_changes_nothing() -> None:
    detector = ToneDetector()
    assert detector.tones(np.zeros((0, FRAME), dtype=np.float32)).shape == (0,)
    x = tones(1.0, 440.0, 480.0)
    assert np.mean([detector.is_tone(f) for f in x.reshape(-1, 320)]) > 0.9
