"""Generated music and wordless singing for the non-speech set (issue 39).

Music and singing are non-speech too: on a held-out recording of wordless singing tiny.en wrote "YO-HOO-HOO HOOO",
on generated plucked music "Beep, beep" and "Bye", and a caller on hold hears music through the telephone line. Each
generator makes ``n`` samples (float32 mono 16 kHz) at ``level`` dBFS RMS, reproducible from its random generator,
with the signature of :data:`streamer.bench.nonspeech.KINDS`:

- :func:`plucked`: Karplus-Strong strings (Karplus and Strong 1983: a noise burst circulating in a damped delay
  line) playing a melody of 3 to 8 notes a second over a bass line, in one of four timbres (steel, nylon, harp,
  koto): how bright the pluck is, where the string is plucked, how long it rings.
- :func:`sustained`: organ, bowed strings or a synthesiser pad holding chords (a four-chord progression, 1.5 to 3 s a
  chord) with a slow melody above, each note a sum of harmonics with the instrument's vibrato and attack.
- :func:`hold_music`: a melody and chords mixed as a hold-music loop, then the line: band-limited to 300-3400 Hz,
  down to 8 kHz, through the G.711 mu-law codec and back up to 16 kHz, as a call delivers it.
- :func:`singing`: a voice without words: a glottal source (harmonics falling 6 dB an octave, glottal -12 dB and lip
  radiation +6 dB) whose pitch follows a sung melody (notes of 0.3 to 1.2 s, glides between them, vibrato of 4.5 to
  6.5 Hz that sets in after the onset), through the formants of a sustained vowel ("ah", "oo", "oh", "ee", "eh"),
  in phrases of 3 to 6 notes with a breath between phrases.
- :func:`humming`: the same voice with the mouth closed, "mm": a nasal murmur whose energy sits below 500 Hz.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.units import SAMPLE_RATE

__all__ = ["hold_music", "humming", "plucked", "singing", "sustained"]

AudioArray = npt.NDArray[np.float32]
Signal = npt.NDArray[np.float64]

_MAJOR = (0, 2, 4, 5, 7, 9, 11)  # the major scale's semitones above its key
_PROGRESSIONS = ((0, 7, 9, 5), (0, 5, 7, 0), (9, 5, 0, 7), (0, 9, 5, 7))  # I-V-vi-IV and others, as chord roots
_TOP_HZ = 7000.0  # no partial is made above this: the 8 kHz Nyquist, with room


@dataclass(frozen=True)
class _Note:
    start: int  # samples into the piece
    length: int  # samples
    midi: float  # pitch as a MIDI note number (69 is A4, 440 Hz)


def _hz(midi: float) -> float:
    return float(440.0 * 2 ** ((midi - 69) / 12))


def _scaled(x: Signal, level_dbfs: float) -> AudioArray:
    rms = float(np.sqrt(np.mean(x**2))) or 1.0
    return np.clip(x * (10 ** (level_dbfs / 20) / rms), -1.0, 1.0).astype(np.float32)


def _limited(x: Signal) -> Signal:
    """``x`` through a soft limiter 12 dB above its RMS, as recorded music is mastered: a plucked string's attack
    is 20 dB and more above its ringing, which would clip at the levels music plays at."""
    ceiling = 4.0 * (float(np.sqrt(np.mean(x**2))) or 1.0)
    limited: Signal = ceiling * np.tanh(x / ceiling)
    return limited


def _melody(rng: np.random.Generator, n: int, per_second: tuple[float, float], low: int, high: int) -> list[_Note]:
    """A melody in a random major key: a walk over the scale within ``[low, high]`` (MIDI), steps mostly small,
    ``per_second`` notes a second on average (the tempo is the piece's; each note lasts one to three beats)."""
    key = int(rng.integers(12))
    pitches = [p for p in range(low, high + 1) if (p - key) % 12 in _MAJOR]
    beat = int(SAMPLE_RATE / rng.uniform(*per_second))
    notes: list[_Note] = []
    index = len(pitches) // 2
    t = 0
    while t < n:
        length = beat * int(rng.choice([1, 1, 1, 2, 2, 3]))
        notes.append(_Note(t, length, float(pitches[index])))
        index = int(np.clip(index + rng.choice([-2, -1, -1, 0, 1, 1, 2, 3, -3]), 0, len(pitches) - 1))
        t += length
    return notes


def _chords(rng: np.random.Generator, n: int, low: int) -> list[list[_Note]]:
    """Chords of a four-chord progression in a random key, 1.5 to 3 s each: a root-position triad from ``low`` and
    its root an octave below."""
    key = int(rng.integers(12))
    roots = _PROGRESSIONS[int(rng.integers(len(_PROGRESSIONS)))]
    length = int(rng.uniform(1.5, 3.0) * SAMPLE_RATE)
    chords = []
    for i, t in enumerate(range(0, n, length)):
        root = low + (key + roots[i % len(roots)]) % 12
        minor = roots[i % len(roots)] in (2, 4, 9)  # ii, iii and vi are minor in a major key
        triad = (root, root + (3 if minor else 4), root + 7)
        chords.append([_Note(t, length, float(p)) for p in (root - 12, *triad)])
    return chords


# ---------------------------------------------------------------------------------------------------------------------
# Plucked strings


@dataclass(frozen=True)
class _Timbre:
    softening: int  # passes of a two-point average over the burst: a finger or nylon string sounds duller than a pick
    position: float  # where along the string it is plucked (0.5: the middle, which silences the even harmonics)
    ring: float  # seconds for a note to fall 60 dB (a low note rings longer, as a period spans more time)
    low: int  # the melody's register (MIDI)
    high: int


_TIMBRES = (
    _Timbre(0, 0.15, 2.5, 55, 79),  # steel-string guitar, picked
    _Timbre(3, 0.2, 1.5, 52, 76),  # nylon-string guitar, fingered
    _Timbre(1, 0.5, 3.0, 60, 88),  # harp
    _Timbre(0, 0.1, 0.7, 62, 86),  # koto or banjo: bright and short
)


def _string(rng: np.random.Generator, hz: float, n: int, timbre: _Timbre) -> Signal:
    """One plucked note of ``n`` samples by Karplus-Strong: y[i] = g (y[i-L] + y[i-L-1]) / 2, a period at a time."""
    period = max(2, round(SAMPLE_RATE / hz - 0.5))  # the average delays half a sample
    burst = rng.uniform(-1.0, 1.0, period)
    for _ in range(timbre.softening):
        burst = (burst + np.roll(burst, 1)) / 2
    if shift := int(timbre.position * period):
        burst = burst - np.roll(burst, shift)  # a comb: the harmonics with a node where it was plucked are missing
    burst -= burst.mean()
    gain = 10 ** (-3 / (hz * timbre.ring))  # per period, so the note falls 60 dB in `ring` seconds
    blocks = -(-n // period)
    y = np.zeros(blocks * period + 1)  # y[0] is the sample before the note; y[1 + i] is sample i
    y[1 : period + 1] = burst
    for k in range(1, blocks):
        before = y[(k - 1) * period : k * period + 1]
        y[k * period + 1 : (k + 1) * period + 1] = gain * 0.5 * (before[1:] + before[:-1])
    return y[1 : n + 1]


def _pluck_notes(rng: np.random.Generator, notes: list[_Note], n: int, timbre: _Timbre, gain: float) -> Signal:
    """Each note plucked at its start and let ring for as long as its string would (at most 3 s)."""
    x = np.zeros(n)
    ring = int(min(timbre.ring, 3.0) * SAMPLE_RATE)
    for note in notes:
        length = min(max(ring, note.length), n - note.start)
        if length > 0:
            x[note.start : note.start + length] += gain * _string(rng, _hz(note.midi), length, timbre)
    return x


def plucked(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """A plucked melody of 3 to 8 notes a second and a bass note on every chord, one timbre a piece."""
    timbre = _TIMBRES[int(rng.integers(len(_TIMBRES)))]
    melody = _melody(rng, n, (3.0, 8.0), timbre.low, timbre.high)
    bass = [chord[0] for chord in _chords(rng, n, timbre.low - 5)]
    x = _pluck_notes(rng, melody, n, timbre, 1.0) + _pluck_notes(rng, bass, n, timbre, 0.7)
    return _scaled(_limited(x) + 1e-5 * rng.standard_normal(n), level)


# ---------------------------------------------------------------------------------------------------------------------
# Sustained instruments


@dataclass(frozen=True)
class _Voice:
    harmonics: tuple[float, ...]  # amplitude of partial 1, 2, 3, ...
    cutoff: float  # Hz: partials above it fall 12 dB an octave (the instrument's body, or the pad's filter)
    attack: float  # seconds to full level (and to silence after the note)
    vibrato: float  # depth, as a fraction of the pitch (5.5 Hz)
    detune: float  # a second copy of the voice this many cents sharp (0: none), as a pad doubles its oscillators


_VOICES = (
    _Voice((1.0, 0.8, 0.6, 0.5, 0.2, 0.3, 0.0, 0.2), 5000.0, 0.02, 0.0, 0.0),  # drawbar organ
    _Voice(tuple(1 / k for k in range(1, 25)), 3000.0, 0.25, 0.006, 0.0),  # bowed strings (a sawtooth's 1/k)
    _Voice(tuple(1 / k for k in range(1, 17)), 1500.0, 0.6, 0.002, 8.0),  # synthesiser pad
)


def _held(note: _Note, voice: _Voice, rng: np.random.Generator, n: int) -> Signal:
    """One held note of ``voice``: its partials with vibrato, shaped by its attack and release."""
    length = min(note.length + int(voice.attack * SAMPLE_RATE), n - note.start)  # it sounds into the next chord
    t = np.arange(length) / SAMPLE_RATE
    x = np.zeros(length)
    for cents in (0.0, voice.detune) if voice.detune else (0.0,):
        hz = _hz(note.midi) * 2 ** (cents / 1200)
        wobble = 1 + voice.vibrato * np.sin(2 * np.pi * rng.uniform(4.5, 6.0) * t + rng.uniform(0, 2 * np.pi))
        phase = 2 * np.pi * hz * np.cumsum(wobble) / SAMPLE_RATE
        for k, amplitude in enumerate(voice.harmonics, start=1):
            if k * hz > _TOP_HZ:
                break
            rolloff = 1 / (1 + (k * hz / voice.cutoff) ** 2)
            x += amplitude * rolloff * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    ramp = max(1, int(voice.attack * SAMPLE_RATE))
    envelope = np.minimum(1.0, np.minimum(np.arange(length) + 1, length - np.arange(length)) / ramp)
    return x * envelope


def _sustain(rng: np.random.Generator, n: int, voice: _Voice, chords: list[list[_Note]], melody: list[_Note]) -> Signal:
    x = np.zeros(n)
    for note, gain in [(note, 1.0) for chord in chords for note in chord] + [(note, 1.5) for note in melody]:
        held = _held(note, voice, rng, n)
        x[note.start : note.start + len(held)] += gain * held
    return x


def sustained(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Organ, bowed strings or a pad, one a piece, holding chords, with a slow melody above half the time."""
    voice = _VOICES[int(rng.integers(len(_VOICES)))]
    chords = _chords(rng, n, 55)
    melody = _melody(rng, n, (1.0, 3.0), 67, 84) if rng.random() < 0.5 else []
    return _scaled(_sustain(rng, n, voice, chords, melody) + 1e-5 * rng.standard_normal(n), level)


# ---------------------------------------------------------------------------------------------------------------------
# Hold music on a telephone line


def _telephone(x: Signal, level: float) -> AudioArray:
    """``x`` (16 kHz) as a call delivers it at ``level``: 300-3400 Hz, 8 kHz, G.711 mu-law, back up to 16 kHz."""
    from streamer.core.audio import decode_mulaw, encode_mulaw, resample

    spectrum = np.fft.rfft(x)
    f = np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE)
    spectrum[(f < 300) | (f > 3400)] = 0
    line = resample(_scaled(_limited(np.fft.irfft(spectrum, len(x))), level), SAMPLE_RATE, 8000)
    wide = resample(decode_mulaw(encode_mulaw(line)), 8000, SAMPLE_RATE)[: len(x)]
    return np.pad(wide, (0, len(x) - len(wide))).astype(np.float32)  # an odd length loses its last sample at 8 kHz


def hold_music(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """A melody (plucked, or a held lead) over sustained chords, through the telephone line at ``level``."""
    chords = _chords(rng, n, 55)
    pad = _sustain(rng, n, _VOICES[int(rng.integers(len(_VOICES)))], chords, [])
    if rng.random() < 0.5:
        timbre = _TIMBRES[int(rng.integers(len(_TIMBRES)))]
        lead = _pluck_notes(rng, _melody(rng, n, (2.0, 5.0), 64, 84), n, timbre, 1.0)
    else:
        lead = _sustain(rng, n, _VOICES[int(rng.integers(len(_VOICES)))], [], _melody(rng, n, (1.5, 4.0), 64, 84))
    mix = lead / (np.sqrt(np.mean(lead**2)) or 1.0) + 0.5 * pad / (np.sqrt(np.mean(pad**2)) or 1.0)
    return _telephone(mix, level)


# ---------------------------------------------------------------------------------------------------------------------
# Wordless singing and humming

# formant frequencies and bandwidths (Hz) of sung vowels (Peterson and Barney 1952; Sundberg 1987, bandwidths), and
# of the closed-mouth "mm" (a nasal murmur: one strong low resonance, the rest damped)
_VOWELS: dict[str, tuple[tuple[float, float], ...]] = {
    "ah": ((730, 90), (1090, 110), (2440, 160), (3400, 250)),
    "oo": ((300, 70), (870, 100), (2240, 150), (3300, 250)),
    "oh": ((570, 80), (840, 100), (2410, 160), (3300, 250)),
    "ee": ((270, 70), (2290, 120), (3010, 180), (3600, 250)),
    "eh": ((530, 80), (1840, 120), (2480, 160), (3500, 250)),
    "mm": ((250, 100), (1200, 400), (2200, 500), (3300, 600)),
}
_OPEN = ("ah", "oo", "oh", "ee", "eh")
_CONTROL = 32  # samples between control points of the pitch and the formants (2 ms): far faster than vibrato
_GLIDE = 0.06  # seconds a sung pitch takes from one note to the next


def _formant_gain(f: Signal, formants: Signal) -> Signal:
    """The gain at frequencies ``f`` of cascaded two-pole resonators (unit gain at 0 Hz); ``formants`` is ``(n,
    formants, 2)``: each control point's centre frequencies and bandwidths."""
    gain = np.ones_like(f)
    for i in range(formants.shape[1]):
        centre, width = formants[:, i, 0], formants[:, i, 1]
        gain *= centre**2 / np.sqrt((centre**2 - f**2) ** 2 + (width * f) ** 2)
    return gain


def _smooth(x: Signal, points: int) -> Signal:
    """A moving average over ``points`` control points (the glide from one note, or vowel, to the next)."""
    if points < 2:
        return x
    padded = np.concatenate([np.full(points, x[0]), x, np.full(points, x[-1])])
    smoothed: Signal = np.convolve(padded, np.ones(points) / points, mode="same")[points : points + len(x)]
    return smoothed


def _phrase(rng: np.random.Generator, vowels: tuple[str, ...], low: int, high: int) -> tuple[list[_Note], list[str]]:
    """3 to 6 sung notes of 0.3 to 1.2 s, stepping through the scale, each on a vowel."""
    notes: list[_Note] = []
    names: list[str] = []
    key = int(rng.integers(12))
    pitches = [p for p in range(low, high + 1) if (p - key) % 12 in _MAJOR]
    index = int(rng.integers(len(pitches)))
    t = 0
    for _ in range(int(rng.integers(3, 7))):
        length = int(rng.uniform(0.3, 1.2) * SAMPLE_RATE)
        notes.append(_Note(t, length, float(pitches[index])))
        names.append(vowels[int(rng.integers(len(vowels)))])
        index = int(np.clip(index + rng.choice([-2, -1, 0, 1, 2]), 0, len(pitches) - 1))
        t += length
    return notes, names


def _sing(rng: np.random.Generator, notes: list[_Note], vowels: list[str], vibrato: tuple[float, float]) -> Signal:
    """One phrase of the voice: ``notes`` (starting at 0, back to back) sung on ``vowels``."""
    length = notes[-1].start + notes[-1].length
    points = -(-length // _CONTROL)
    pitch = np.zeros(points)
    formants = np.zeros((points, 4, 2))
    onset = np.zeros(points)  # control points since the note began
    for note, vowel in zip(notes, vowels, strict=True):
        first, last = note.start // _CONTROL, -(-(note.start + note.length) // _CONTROL)
        pitch[first:last] = note.midi
        formants[first:last] = _VOWELS[vowel]
        onset[first:last] = np.arange(last - first)
    glide = int(_GLIDE * SAMPLE_RATE / _CONTROL)
    pitch = _smooth(pitch, glide)
    formants = np.stack([_smooth(column, glide) for column in formants.reshape(points, -1).T], axis=1).reshape(
        formants.shape
    )
    seconds = np.arange(points) * _CONTROL / SAMPLE_RATE
    rate, depth = rng.uniform(4.5, 6.5), rng.uniform(*vibrato)
    settle = np.clip(onset * _CONTROL / SAMPLE_RATE / 0.25, 0.0, 1.0)  # vibrato sets in over a note's first 250 ms
    drift = np.cumsum(rng.normal(0.0, 0.01, points))  # slow wander of intonation, in semitones
    drift -= _smooth(drift, 200)
    semitones = pitch + drift + settle * depth * np.sin(2 * np.pi * rate * seconds)
    hz_control = 440.0 * 2 ** ((semitones - 69) / 12)
    t = np.arange(length)
    hz = np.interp(t, np.arange(points) * _CONTROL, hz_control)
    phase = 2 * np.pi * np.cumsum(hz) / SAMPLE_RATE
    x = np.zeros(length)
    for k in range(1, int(_TOP_HZ / hz_control.min()) + 1):
        partial = k * hz_control
        amplitude = np.where(partial < _TOP_HZ, _formant_gain(partial, formants) / k, 0.0)
        x += np.interp(t, np.arange(points) * _CONTROL, amplitude) * np.sin(k * phase)
    # the breath in the voice, and a level that swells and fades with each phrase
    x += 0.02 * float(np.sqrt(np.mean(x**2))) * rng.standard_normal(length)
    ramp = int(0.08 * SAMPLE_RATE)
    envelope = np.minimum(1.0, np.minimum(t + 1, length - t) / ramp)
    return x * envelope * (1 + 0.1 * np.sin(np.pi * t / length))


def _breath(rng: np.random.Generator, length: int) -> Signal:
    """An in-breath between phrases: noise of 400 Hz to 5 kHz rising and falling."""
    spectrum = np.fft.rfft(rng.standard_normal(length))
    f = np.fft.rfftfreq(length, 1 / SAMPLE_RATE)
    spectrum[(f < 400) | (f > 5000)] = 0
    noise = np.fft.irfft(spectrum, length)
    return noise / (np.sqrt(np.mean(noise**2)) or 1.0) * np.hanning(length)


def _voice(n: int, rng: np.random.Generator, level: float, vowels: tuple[str, ...]) -> AudioArray:
    """Phrases of a voice in one register (a man's or a woman's), a breath at -20 dB between them."""
    low, high = ((45, 62), (57, 76))[int(rng.integers(2))]
    vibrato = (0.1, 0.6) if vowels == ("mm",) else (0.2, 0.8)  # semitones: a hum wavers less than an open voice
    x = np.zeros(n)
    t = int(rng.uniform(0.0, 0.5) * SAMPLE_RATE)
    while t < n:
        notes, names = _phrase(rng, vowels, low, high)
        phrase = _sing(rng, notes, names, vibrato)
        sung = phrase[: n - t]
        x[t : t + len(sung)] = sung / (np.sqrt(np.mean(phrase**2)) or 1.0)
        t += len(phrase) + int(rng.uniform(0.1, 0.3) * SAMPLE_RATE)
        breath = int(rng.uniform(0.3, 0.7) * SAMPLE_RATE)
        x[t : t + breath] = 0.1 * _breath(rng, breath)[: max(0, n - t)]
        t += breath + int(rng.uniform(0.05, 0.2) * SAMPLE_RATE)
    return _scaled(x + 1e-5 * rng.standard_normal(n), level)


def singing(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Wordless singing on sustained open vowels ("ah", "oo", "oh", "ee", "eh"), one vowel a note."""
    return _voice(n, rng, level, _OPEN)


def humming(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Humming with the mouth closed, "mm"."""
    return _voice(n, rng, level, ("mm",))
