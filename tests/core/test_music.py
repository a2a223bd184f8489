"""Music and wordless singing are not speech (issue 39): the music detector flags a stream that holds notes, the VAD
built on it labels generated music and singing non-speech, and real speech keeps its labels."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from streamer.bench.nonspeech import HELD_OUT_SEED, KINDS, generate
from streamer.core.errors import ConfigError
from streamer.core.music import MusicDetector, MusicOptions
from streamer.core.vad import VadOptions
from streamer.offline.audiofile import load_audio
from tests.conftest import SHARED_DATA, load_clip
from tests.core.test_tonal import kept, shared_speech, speech_mask

SR = 16000
FRAME = 480  # the VAD's 30 ms frame
MUSIC = ("plucked", "sustained", "hold", "singing", "humming")
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared speech data not found at {SHARED_DATA}")
Audio = npt.NDArray[np.float32]
WITHOUT = VadOptions(reject_music=False)


def flagged(x: Audio, frame: int = FRAME, per_call: int = 3) -> npt.NDArray[np.bool_]:
    detector = MusicDetector()
    frames = x[: x.size // frame * frame].reshape(-1, frame)
    calls = [detector.music(frames[i : i + per_call]) for i in range(0, len(frames), per_call)]
    return np.concatenate(calls)


def note(seconds: float, hz: float, level_dbfs: float = -25.0, seed: int = 0) -> Audio:
    """A held note of a few harmonics over a -80 dBFS floor."""
    t = np.arange(int(seconds * SR)) / SR
    x = sum(np.sin(2 * np.pi * k * hz * t) / k for k in range(1, 6))
    x = np.asarray(x) * 10 ** (level_dbfs / 20) / np.sqrt(np.mean(np.asarray(x) ** 2))
    return (x + 1e-4 * np.random.default_rng(seed).standard_normal(t.size)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# Generated music and singing are not speech


# measured: the share of each kind's audio (20 s pieces, both levels, two seeds) that the VAD labels speech without
# the music detector, and at most with it (what is left: a stretch at the start of a piece, or where a chord's
# voices blur the pitch; no word comes of it, tests/bench/test_nonspeech.py)
LABELLED = {
    "plucked": (1.0, 0.05),
    "sustained": (0.07, 0.11),  # webrtc's energy gate takes most of a held chord already, the detector some more
    "hold": (0.0, 0.0),
    "singing": (0.89, 0.0),
    "humming": (0.37, 0.0),
}


@pytest.mark.parametrize("kind", MUSIC)
def test_generated_music_and_singing_are_never_speech(kind: str) -> None:
    least_before, most_after = LABELLED[kind]
    for level in KINDS[kind][1]:
        for seed in range(2):  # each seed its own timbre, voice, key and tempo
            x = generate(kind, 20.0, level, seed).samples
            before, after = speech_mask(x, WITHOUT).mean(), speech_mask(x).mean()
            assert before >= least_before, f"{kind} {level} #{seed}: {before:.3f} speech without the detector"
            assert after <= min(before, most_after), f"{kind} {level} #{seed}: {after:.3f} speech with it"


def test_a_held_note_is_music_and_a_gliding_one_is_not() -> None:
    held = flagged(note(3.0, 220.0))
    assert held[SR // FRAME :].all()  # from the first second on, at the latest
    # the same note gliding an octave a second, as no instrument holds and speech does all the time
    t = np.arange(3 * SR) / SR
    glide = np.sin(2 * np.pi * np.cumsum(220.0 * 2 ** np.sin(2 * np.pi * 0.5 * t)) / SR).astype(np.float32)
    assert not flagged(0.05 * glide).any()


def test_silence_and_noise_are_not_music() -> None:
    assert not flagged(np.zeros(3 * SR, dtype=np.float32)).any()
    rng = np.random.default_rng(0)
    assert not flagged((0.05 * rng.standard_normal(5 * SR)).astype(np.float32)).any()


@pytest.mark.parametrize(
    ("frame", "per_call"), [(480, 1), (480, 4), (512, 3), (160, 10), (320, 7), (320, 150), (320, 10_000)]
)
def test_the_verdicts_do_not_depend_on_how_many_frames_come_at_once(frame: int, per_call: int) -> None:
    x = np.concatenate([generate("plucked", 6.0, -25, seed=0).samples, load_clip("1089-134686-0001.flac")])
    one = flagged(x, frame, 1)
    assert np.array_equal(flagged(x, frame, per_call), one)
    assert one.any() and not one.all()


def test_the_music_detector_works_under_any_frame_classifier() -> None:
    class AllVoiced:
        """Every frame voiced, Silero's frame size: what is left is the music detector."""

        frame_samples = 512

        def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
            return np.ones(len(frames), dtype=np.bool_)

    x = generate("singing", 20.0, -20, seed=0).samples
    # measured: 88 % without it (the energy gate takes the breaths), 6 % with it (the first notes)
    assert speech_mask(x, WITHOUT, AllVoiced()).mean() > 0.85
    assert speech_mask(x, VadOptions(), AllVoiced()).mean() < 0.1


def test_wrong_use() -> None:
    for bad in (
        MusicOptions(min_periodicity=0.1),
        MusicOptions(flat_ms=10),
        MusicOptions(max_wobble=0.0),
        MusicOptions(long_run_ms=50),
        MusicOptions(min_held_share=0.0),
        MusicOptions(memory_ms=50),
        MusicOptions(min_evidence_ms=5000, memory_ms=1000),
        MusicOptions(opening_margin=-0.1),
        MusicOptions(opening_margin=0.6),
        MusicOptions(min_notes=-1),
        MusicOptions(note_ms=10),
        MusicOptions(note_step=0.0),
    ):
        with pytest.raises(ConfigError):
            MusicDetector(bad)
    detector = MusicDetector()
    assert detector.music(np.zeros((0, FRAME), dtype=np.float32)).shape == (0,)
    detector.music(np.zeros((2, FRAME), dtype=np.float32))
    with pytest.raises(ValueError, match="480-sample frames, then 160"):
        detector.music(np.zeros((2, 160), dtype=np.float32))


def test_plucked_music_after_speech_ends_the_span_within_its_first_notes() -> None:
    # a spoken sentence, then 10 s of plucked music (seeds 0 to 3, both levels): the speech span runs on into the
    # music by its hangover and the music's first notes, at most 1.44 s (the notes rule: four notes of distinct pitch
    # in the last memory_ms are music). Without it, seed 1 kept the span open for 3.74 s of the music: the long
    # memory still held the sentence's unheld frames, and each pluck's attack is not held. The bound leaves a pitch
    # tracker's frame or two of room on another CPU's FFT
    speech = load_clip("1089-134686-0001.flac")
    for seed in range(4):
        for level in KINDS["plucked"][1]:
            x = np.concatenate([speech, generate("plucked", 10.0, level, seed).samples])
            labelled = speech_mask(x)[speech.size :].sum() / SR
            assert labelled <= 2.5, f"plucked {level} #{seed}: {labelled:.2f} s of the music labelled speech"


@needs_shared
def test_the_guitar_after_its_spoken_count_in_is_not_speech() -> None:
    # guitar_16k.wav: a spoken "one, two, three, four", then strummed and picked guitar from 3.05 s. Measured: the
    # span ends 1.2 s into the guitar (at 4.23 s); without the notes rule it ran to 8.4 s, and the closing window's
    # 5 s of guitar held numbers that only the fused attention kernel's rounding kept tiny.en from writing
    x = load_audio(SHARED_DATA / "nonspeech" / "guitar_16k.wav").samples
    mask = speech_mask(x)
    assert mask[: 3 * SR].mean() > 0.5  # the count is speech
    assert mask[3 * SR + SR // 20 :].sum() / SR <= 2.0


# ---------------------------------------------------------------------------------------------------------------------
# Real speech keeps its labels


@pytest.mark.parametrize("first_seed", [0, HELD_OUT_SEED])
def test_wordless_singing_is_never_speech_from_a_streams_first_note(first_seed: int) -> None:
    # 15 seeds of wordless singing at both levels (7.5 minutes), each a fresh stream: no frame is speech, the first
    # notes included. Before the short memory waited for a run's fate, held-out seeds 1003 and 1013 each started a
    # span at a phrase's first note after a breath (15.6 s, 7.5 s: "Oh. Oh."); before a stream's opening was judged
    # as it is now (a run held for long_run_ms before the verdict is a note; opening_margin), tuning seeds 2, 5, 7, 9
    # and 11 and held-out seed 1009 each started one at the stream's first note (15 words on the tuning seeds)
    for seed in range(first_seed, first_seed + 15):
        for level in KINDS["singing"][1]:
            mask = speech_mask(generate("singing", 30.0, level, seed).samples)
            assert not mask.any(), f"singing {level} #{seed}: speech at {np.argmax(mask) / SR:.2f} s"


def test_a_streams_opening_margin_ends_with_the_opening() -> None:
    # the margin is for a stream's first verdicts only (memory_ms from the first): from the third second of hold music
    # on, and through the speech after it, the verdicts are the same with a margin that would hold almost anything for
    # music as with none (measured, were the opening never to end: 32 frames of the music and the speech differ)
    speech = load_clip("1089-134686-0001.flac")
    x = np.concatenate([generate("hold", 10.0, -20, seed=0).samples, speech])
    frames = x[: x.size // FRAME * FRAME].reshape(-1, FRAME)
    none, wide = (MusicDetector(MusicOptions(opening_margin=m)).music(frames) for m in (0.0, 0.55))
    assert none[: 10 * SR // FRAME].mean() > 0.7  # measured: 0.79 (the rest: between its chords)
    after = 3 * SR // FRAME
    assert np.array_equal(none[after:], wide[after:])
    assert not np.array_equal(none[:after], wide[:after])  # ... and differ in the opening


def test_speech_in_the_bundled_clip_keeps_its_labels() -> None:
    x = load_clip("1089-134686-0001.flac")
    before, after = speech_mask(x, WITHOUT), speech_mask(x)
    assert before.mean() > 0.8
    assert np.array_equal(before, after)


def test_speech_after_music_is_speech_within_a_second() -> None:
    # hold music, a song or a guitar, then the agent: the short memory (recent_ms) gives the verdict back to the speech
    # within its first second (measured: 0.6 s, and one frame near 1 s); the VAD then labels it as it would without
    # the detector, and the start it missed is mostly brought back by the padding before speech
    speech = load_clip("1089-134686-0001.flac")
    for kind in ("hold", "singing", "plucked"):
        x = np.concatenate([generate(kind, 10.0, -20, seed=0).samples, speech])
        assert not flagged(x)[(10 * SR + 12 * SR // 10) // FRAME :].any(), kind
        with_it, without = speech_mask(x)[10 * SR :], speech_mask(x, WITHOUT)[10 * SR :]
        assert np.array_equal(with_it[12 * SR // 10 :], without[12 * SR // 10 :]), kind
        assert with_it.mean() >= without.mean() - 0.1, kind  # measured: 0.06 less after singing, 0.03 after plucking


@needs_shared
def test_real_speech_keeps_its_labels() -> None:
    # all of the shared English speech: LibriSpeech test-clean and test-other, long-form (a German and a Spanish
    # reading too), 8 kHz telephony, conversation, the miscellany. Measured: 0.45 of the 1248 s that the VAD labels
    # speech without the detector are lost with it: the padding before a few sentences (30 to 40 ms each), and 0.25 s
    # of a file whose first word opens on a held "l" (3331-159605-0006, "Let me see": a stream's opening judged as a
    # song's first note; the transcript keeps every word)
    folders = {"librispeech": "test-*/*/*/*.flac", "longform": "*.*[a-z0-9]", "telephony": "*.wav"}
    folders |= {"conversation": "*.wav", "english_misc": "*.wav"}
    result = kept([path for folder, pattern in folders.items() for path in shared_speech(folder, pattern)], WITHOUT)
    assert result.reference > 1000 * SR
    assert result.kept / result.reference >= 1 - 0.0005
