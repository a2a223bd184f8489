"""The generated music and wordless singing (issue 39) are what they say: at their level for their length, the same
from the same seed, notes that hold a pitch, a voice with formants and vibrato, and hold music that went through a
telephone line."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from streamer.bench.nonspeech import KINDS, generate
from streamer.core.units import SAMPLE_RATE

MUSIC = ("plucked", "sustained", "hold", "singing", "humming")


def _rms_db(x: npt.NDArray[np.float32]) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(x.astype(np.float64) ** 2))))


def _spectrum(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    return np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE), np.abs(np.fft.rfft(x.astype(np.float64))) ** 2


@pytest.mark.parametrize("kind", MUSIC)
def test_music_comes_at_its_level_for_its_length_from_its_seed(kind: str) -> None:
    assert kind in KINDS
    for level in KINDS[kind][1]:
        for seed in range(3):  # each seed picks its own timbre, voice or register
            piece = generate(kind, 3.0, level, seed)
            assert len(piece.samples) == 3 * SAMPLE_RATE and piece.samples.dtype == np.float32
            # the telephone codec moves the level a little; the others are scaled to it exactly
            assert _rms_db(piece.samples) == pytest.approx(level, abs=1.0 if kind == "hold" else 0.1)
            assert np.max(np.abs(piece.samples)) < 1.0  # loud enough to matter, never clipped
    assert np.array_equal(generate(kind, 2.0, -30, seed=1).samples, generate(kind, 2.0, -30, seed=1).samples)
    assert not np.array_equal(generate(kind, 2.0, -30, seed=1).samples, generate(kind, 2.0, -30, seed=2).samples)


def test_hold_music_is_band_limited_like_a_telephone_line() -> None:
    for seed in range(3):
        f, p = _spectrum(generate("hold", 4.0, -20, seed).samples)
        inside = np.sum(p[(f >= 300) & (f <= 3400)])
        # nothing above 4 kHz survives the 8 kHz line; below 300 Hz and up to 4 kHz only the codec's noise
        assert np.sum(p[f > 4000]) < 1e-4 * inside
        assert np.sum(p[f < 250]) < 0.01 * inside
        assert np.sum(p[(f > 3600) & (f <= 4000)]) < 0.01 * inside
        # mu-law: the samples take the codec's 256 values at 8 kHz, so the 16 kHz stream is not the smooth original
        assert len(np.unique(np.round(generate("hold", 1.0, -20, seed).samples[::2], 6))) > 50


def _pitch_track(x: npt.NDArray[np.float32], frame: int = 480) -> npt.NDArray[np.float64]:
    """The strongest spectral peak under 1.2 kHz per 64 ms window, frame by frame (Hz)."""
    window = np.hanning(1024)
    f = np.fft.rfftfreq(4096, 1 / SAMPLE_RATE)
    low = (f > 70) & (f < 1200)
    peaks = []
    for end in range(1024, len(x), frame):
        a = np.abs(np.fft.rfft(x[end - 1024 : end] * window, 4096))
        peaks.append(f[low][np.argmax(a[low])])
    return np.array(peaks)


def test_instruments_play_notes_that_hold_their_pitch() -> None:
    # a plucked melody of 3 to 8 notes a second: its strongest partial steps between a few steady values
    track = _pitch_track(generate("plucked", 6.0, -25, seed=0).samples)
    steady = np.abs(np.diff(track)) < 4.0  # one 3.9 Hz bin
    assert steady.mean() > 0.6
    assert 3 <= len(np.unique(np.round(track))) <= 60
    # sustained chords (and a slow melody above them): the same partials for seconds at a time
    track = _pitch_track(generate("sustained", 6.0, -25, seed=0).samples)
    assert (np.abs(np.diff(track)) < 4.0).mean() > 0.7


def test_singing_is_a_voice_with_vibrato_formants_and_breaths() -> None:
    x = generate("singing", 10.0, -20, seed=0).samples
    # formants: an open vowel puts a good share of its energy between 500 Hz and 3 kHz, where the hum puts little
    f, p = _spectrum(x)
    mid = np.sum(p[(f > 500) & (f < 3000)]) / np.sum(p)
    f, p = _spectrum(generate("humming", 10.0, -20, seed=0).samples)
    assert mid > 0.1 > np.sum(p[(f > 500) & (f < 3000)]) / np.sum(p)
    # phrases with breaths between them: some 100 ms stretches are far quieter than the singing
    frames = x[: len(x) // 1600 * 1600].reshape(-1, 1600).astype(np.float64)
    level = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)
    assert np.sum(level < np.median(level) - 15) >= 3
    # vibrato: the pitch of a held note wavers by a fraction of a semitone, several times a second
    track = _pitch_track(x, frame=160)
    moving = np.abs(np.diff(track)) > 0
    assert 0.2 < moving.mean() < 0.95
