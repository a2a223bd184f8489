"""Music and singing detection: held notes are not speech, however voiced they look (issue 39).

Sans-I/O: :class:`MusicDetector` takes the voice activity detector's frames in order, a chunk's at once (16 kHz
float32, any frame length), and says for each whether the stream is playing music there. The VAD treats such a frame
as unvoiced, as it does a steady tone (:mod:`streamer.core.tonal`), so music never starts or prolongs a speech span
and never reaches the engine: on generated plucked music tiny.en wrote "Beep, beep" and "Bye", on wordless singing
"YO-HOO-HOO HOOO".

What music is here: voiced audio whose pitch is *held*. Each frame's pitch and periodicity come from the normalised
autocorrelation of the last 64 ms (the lag of its first strong peak, 10 to 200 samples: 80 Hz to 1.6 kHz). A
periodic frame is held when its pitch has stayed within a fraction of a semitone for the last ``flat_ms`` (a note of
an instrument: plucked, bowed, blown or struck, a chord holding still), or when it ends an unbroken periodic run of
``long_run_ms`` over which the pitch stayed within ``max_vibrato`` semitones (a sung note, whose vibrato moves the
pitch too much for the first test but around one centre, and never stops the voicing). Speech is the opposite on
both counts: its pitch glides through every syllable, semitones in a few hundred milliseconds, and its voicing breaks
at every few consonants. The stream is playing music while the held frames make up at least ``min_held_share`` of its
recent periodic frames (an exponential memory of ``memory_ms``, fed by periodic frames only: pauses and breaths keep
the verdict, and speech after music takes it back within a second), once there were enough of them
(``min_evidence_ms``) to judge; until then, a held frame, or one that ends ``undecided_ms`` of steady voicing, is
taken for music, so that a song's first notes do not start a speech span before the verdict is in (the VAD starts
one on 120 ms of voicing). A short memory (``recent_ms``) lets speech after music take the verdict back quickly; the
frames of a periodic run not held yet stay out of it until the run is judged: held (a note, whose first frames, still
gliding into it, are then counted as held in both memories while the stream plays), broken (as speech's voicing is
every few consonants) or ``long_run_ms`` long without a held frame. A sung phrase's first note after a breath is then
judged as a note, not by its first frames (on 15 minutes of held-out singing seeds, 4 words before, 0 now;
docs/benchmarks.md, nonspeech). A stream's very first note is judged the same way: before the verdict is in, a run
that holds within ``max_vibrato`` for ``long_run_ms`` is a note, and its frames still waiting count as held; and for
the stream's first ``memory_ms`` of verdicts the share of held frames may dip ``opening_margin`` below the music share
before the stream stops playing (a song's first notes at a fresh stream: 15 words on the tuning seeds before, 0 now).
Music that follows speech (a guitar after a spoken count-in, hold music after the agent) is judged by its notes too:
the long memory still holds the speech's unheld frames, and a plucked or strummed note is held only after its attack,
so the held share took 4.9 s of the shared guitar recording's strumming to reach the music share, and tiny.en wrote
numbers into it. The stream is also playing while its last ``memory_ms`` held ``min_notes`` notes of distinct pitch:
melody and harmony, which speech does not make (the span after the count-in now ends 1.2 s into the guitar).
The thresholds' measurements are in :class:`MusicOptions`.

Cost: one 2048-point real FFT and its inverse per frame (zero-padded: a linear autocorrelation), batched over a chunk's
frames (issue 37), and a bounded buffer of the last 1024 samples, so CPU per stream is linear in the audio and memory
constant in its length.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.tonal import TrailingWindows
from streamer.core.units import SAMPLE_RATE

__all__ = ["MusicDetector", "MusicOptions"]

_N_WINDOW = 1024  # 64 ms: three periods of an 80 Hz voice, and the tone detector's window
_N_FFT = 2 * _N_WINDOW  # zero-padded, so the autocorrelation does not wrap round
_BLOCK_FRAMES = 64  # frames analysed at once (1.3 s of 20 ms frames): ~4 MB of spectra, whatever the chunk
_BAND_HZ = (60.0, 4000.0)  # mains hum's fundamental below, the air above the telephone band, are left out
_MIN_LAG = 10  # 1.6 kHz: the top of a harp's or a whistled melody, above any voice's pitch
_MAX_LAG = 200  # 80 Hz: the lowest voice, a bass line's notes are heard through their harmonics
_SILENT = 1e-9  # mean square below this (-90 dBFS) is silence, never periodic
_NEAR_BEST = 0.85  # the first autocorrelation peak this close to the best is the period (not a multiple of it)


@dataclass(frozen=True)
class MusicOptions:
    """What counts as music. Validated in :meth:`validate`."""

    # Measured (issue 39) over the shared English speech (LibriSpeech, long-form, 8 kHz telephony, conversation, the
    # miscellany: 1248 s that webrtc labels speech) and 20 to 30 s of every generated music kind at both levels, two
    # seeds each, through the VAD (the tuning commands are in the report of issue 39): these defaults keep all but
    # 0.17 s of the speech labels and take every plucked, singing and humming piece to 0 % speech.

    # a frame is periodic when its normalised autocorrelation at the pitch period is at least this (0.7 missed the
    # polyphonic stretches of chords and hold music, 0.5 let speech's breathy transitions in and lost 4.8 s of speech)
    min_periodicity: float = 0.6
    # a periodic frame is a held note when its pitch (octave errors folded) stayed within max_wobble semitones for
    # this long (60 ms: a plucked melody of 8 notes a second gives each note 4 frames; 90 ms left half of one seed's
    # melody unheld) ...
    flat_ms: int = 60
    max_wobble: float = 0.3
    # ... or for an unbroken periodic run this long within max_vibrato semitones (a singer's vibrato is +-0.2 to 0.8
    # semitone; speech's pitch moves further within 300 ms)
    long_run_ms: int = 300
    max_vibrato: float = 2.0
    # music: held frames are at least this share of the recent periodic frames (speech: above 0.6 in 0.3 % of its
    # frames, at most 0.67; plucked, sung and hummed music: below 0.64 in a tenth of theirs at most) ...
    min_held_share: float = 0.6
    # ... remembered with this time constant (all frames decay, periodic frames add) ...
    memory_ms: int = 1500
    # ... once the remembered periodic frames add up to this much audio; until then (a stream's start, or after a
    # few seconds without voicing) a frame is music if it is held, or ends undecided_ms of periodic audio within
    # max_vibrato semitones: a song's first notes would otherwise start a speech span before the verdict (a sung
    # "Oh..." at every fresh stream), and speech's first syllables lose 0.03 s in all (pad_before_ms brings it back)
    min_evidence_ms: int = 300
    undecided_ms: int = 150
    # the held frames must also be this share of the periodic frames of a short memory of recent_ms: music that gives
    # way to speech (hold music, then the agent) kept the long memory's verdict for 1.4 s of the speech without it
    recent_ms: int = 300
    min_recent_share: float = 0.3
    # a stream's opening (memory_ms from its first verdict, ended early by a verdict of not playing): while the stream
    # plays, the held share may fall this far below min_held_share before it stops. A song's first notes reach the
    # verdict with their onsets and glides counted as not held: on the tuning seeds (15 minutes of singing, 30 s pieces,
    # a fresh stream each) one phrase's second note dipped to 0.58 for 120 ms, enough to start a span ("Aww."). 0.03
    # to 0.06 took the tuning seeds to no span and lost no more speech; 0.07 lost the rest of a sentence whose first
    # word starts on a held "l" (0.9 s of the shared speech against 0.45)
    opening_margin: float = 0.04
    # music after speech (a guitar after a spoken count-in, hold music after the agent): the long memory still holds
    # the speech's unheld frames, and a strummed or plucked note is held only after its attack, so the held share
    # climbed to the music share 4.9 s into the shared guitar_16k.wav's strumming. Melody and harmony are something
    # speech does not do: the stream is also playing while the last memory_ms held at least min_notes notes of
    # distinct pitch (note_step semitones apart), each periodic and within max_wobble for note_ms, and a held run's
    # earlier frames then count as held. Measured over the shared speech (1248 s that webrtc labels speech): no 30 ms
    # frame saw more than 3 such notes in 1.5 s; min_notes 3 lost 0.7 s more of it, note_ms 60 lost 2.7 s; 4 and 5
    # lost none (5 cleared less music: hold music 26.8 s labelled speech against 17.7, seeds 0 to 7). 0 turns it off
    min_notes: int = 4
    note_ms: int = 90
    note_step: float = 0.7

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not 0.3 <= self.min_periodicity <= 1.0:
            raise ConfigError("music min_periodicity must be between 0.3 and 1")
        if not 30 <= self.flat_ms <= 1000:
            raise ConfigError("music flat_ms must be between 30 and 1000")
        if not 0.0 < self.max_wobble <= 2.0:
            raise ConfigError("music max_wobble must be between 0 and 2 semitones")
        if not 100 <= self.long_run_ms <= 5000:
            raise ConfigError("music long_run_ms must be between 100 and 5000")
        if not 0.0 < self.max_vibrato <= 6.0:
            raise ConfigError("music max_vibrato must be between 0 and 6 semitones")
        if not 0.0 < self.min_held_share <= 1.0:
            raise ConfigError("music min_held_share must be between 0 and 1")
        if not 100 <= self.memory_ms <= 30000:
            raise ConfigError("music memory_ms must be between 100 and 30000")
        if not 0 <= self.min_evidence_ms <= self.memory_ms:
            raise ConfigError("music min_evidence_ms must be between 0 and memory_ms")
        if not 0 <= self.undecided_ms <= 1000:
            raise ConfigError("music undecided_ms must be between 0 and 1000")
        if not 30 <= self.recent_ms <= self.memory_ms:
            raise ConfigError("music recent_ms must be between 30 and memory_ms")
        if not 0.0 <= self.min_recent_share <= 1.0:
            raise ConfigError("music min_recent_share must be between 0 and 1")
        if not 0.0 <= self.opening_margin < self.min_held_share:
            raise ConfigError("music opening_margin must be at least 0 and below min_held_share")
        if not 0 <= self.min_notes <= 20:
            raise ConfigError("music min_notes must be between 0 and 20")
        if not 30 <= self.note_ms <= 1000:
            raise ConfigError("music note_ms must be between 30 and 1000")
        if not 0.0 < self.note_step <= 12.0:
            raise ConfigError("music note_step must be between 0 and 12 semitones")


@dataclass
class _Note:
    """A note the stream held: its last frame so far (by number) and its pitch (semitones, MIDI numbering)."""

    last: int
    pitch: float


class MusicDetector:
    """Say, frame by frame, whether the stream is playing music (or singing without words).

    Call :meth:`music` with every frame of the stream in order, a chunk's frames at once (silent ones too: the
    verdict carries the stream's recent past), always frames of the same length, and treat a frame it flags as
    unvoiced.
    """

    def __init__(self, options: MusicOptions | None = None) -> None:
        self.options = options = options or MusicOptions()
        options.validate()
        self._window = np.hanning(_N_WINDOW)
        # the window's own autocorrelation, which a perfectly periodic signal's is scaled by at each lag
        window_ac = np.correlate(self._window, self._window, mode="full")[_N_WINDOW - 1 :]
        self._unbias = window_ac[0] / window_ac[_MIN_LAG - 1 : _MAX_LAG + 2]
        freqs = np.fft.rfftfreq(_N_FFT, 1 / SAMPLE_RATE)
        self._outside = (freqs < _BAND_HZ[0]) | (freqs > _BAND_HZ[1])
        self._trailing = TrailingWindows(_N_WINDOW)
        self._frame = 0  # frame length, from the first call
        self._pitches: deque[float | None] = deque()  # the last long_run_ms of pitches (None: not periodic)
        self._periodic = 0.0  # remembered periodic frames (exponential memory)
        self._held = 0.0  # ... of them held notes
        self._decay = 1.0
        self._recent_periodic = 0.0  # the same with the short memory of recent_ms
        self._recent_held = 0.0
        self._recent_decay = 1.0
        # the current unbroken periodic run's frames not yet held, by frame number: kept out of the short memory until
        # the run is judged (see _settle)
        self._pending: list[int] = []
        self._count = 0  # frames seen
        self._opening = 0  # frames of the stream's opening left (see opening_margin)
        self._last = False  # the last frame's verdict
        self._flat_frames = self._long_frames = self._undecided_frames = 0  # the options' times in frames
        self._note_frames = self._memory_frames = 0
        self._notes: deque[_Note] = deque()  # the notes of the last memory_ms, the last one possibly still sounding
        self._in_note = False
        self._evidence = 0.0  # min_evidence_ms in frames

    def music(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        """Analyse the next frames, shaped ``(n, frame_samples)``, float32 mono 16 kHz, in stream order: whether the
        stream is playing music at each."""
        n, length = frames.shape
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        if not self._frame:
            self._setup(length)
        elif length != self._frame:
            raise ValueError(f"MusicDetector was given {self._frame}-sample frames, then {length}")
        # analysed a block at a time: the spectra of a whole chunk at once would cost ~60 kB per frame, 100 MB for a
        # frame at /v1/listen's size limit (the hostile-client suite's memory bound); the same numbers either way
        pitches: list[float] = []
        periodic: list[bool] = []
        for start in range(0, n, _BLOCK_FRAMES):
            block_pitches, block_periodic = self._analyse(frames[start : start + _BLOCK_FRAMES])
            pitches += block_pitches
            periodic += block_periodic
        verdicts = np.zeros(n, dtype=np.bool_)
        options = self.options
        for i in range(n):
            self._count += 1
            self._pitches.append(pitches[i] if periodic[i] else None)
            long_run = periodic[i] and self._within(self._long_frames, options.max_vibrato)
            held = long_run or (periodic[i] and self._within(self._flat_frames, options.max_wobble))
            self._periodic *= self._decay
            self._held *= self._decay
            self._recent_periodic *= self._recent_decay
            self._recent_held *= self._recent_decay
            undecided = self._periodic < self._evidence
            notes = options.min_notes > 0 and self._note(periodic[i], pitches[i])
            playing = not undecided and self._held >= options.min_held_share * self._periodic
            if periodic[i]:
                self._periodic += 1.0
                self._held += float(held)
                if held:
                    # the run is a note: while the stream plays, or before there is a verdict (a stream's first
                    # note, whose vibrato keeps most of its frames from being flat), the run's earlier frames were
                    # the same note
                    self._settle(credit=(long_run and (playing or undecided)) or notes)
                    self._recent_periodic += 1.0
                    self._recent_held += 1.0
                else:
                    self._pending.append(self._count)
                    if len(self._pending) >= self._long_frames:
                        self._settle(credit=False)  # long_run_ms without a held frame: not a note
            else:
                self._settle(credit=False)  # the run broke before it was held: speech's voicing does
            if self._periodic >= self._evidence:
                # ... and the last few hundred milliseconds do not say otherwise: speech after music is speech within
                # a syllable (the frames of a run not yet held wait for the run's fate: a sung phrase's next note
                # after a breath, not held for its first frames, is not judged by them)
                share = options.min_held_share - (options.opening_margin if self._opening > 0 and self._last else 0.0)
                verdicts[i] = (self._held >= share * self._periodic or notes) and (
                    self._recent_held >= options.min_recent_share * self._recent_periodic
                )
                self._opening = self._opening - 1 if verdicts[i] else 0
            else:
                # too little of the stream's recent past to judge it: steady voicing is not taken for speech meanwhile,
                # or a song's first notes would start a speech span before the verdict came (min_speech_ms is 120)
                verdicts[i] = held or (
                    options.undecided_ms > 0 and self._within(self._undecided_frames, options.max_vibrato)
                )
            self._last = bool(verdicts[i])
        return verdicts

    def _note(self, periodic: bool, pitch: float) -> bool:
        """Follow the stream's notes with this frame: whether the last memory_ms held min_notes distinct ones."""
        options = self.options
        notes = self._notes
        flat = periodic and self._within(self._note_frames, options.max_wobble)
        if flat:
            if self._in_note:
                notes[-1].last = self._count
            else:
                notes.append(_Note(self._count, pitch))
        self._in_note = flat
        while notes and notes[0].last < self._count - self._memory_frames:
            notes.popleft()
        if len(notes) < options.min_notes:
            return False
        # a note takes note_ms and a break, so there are a handful at most, and the count stops at min_notes
        distinct: list[float] = []
        for note in notes:
            if all(abs(note.pitch - p) >= options.note_step for p in distinct):
                distinct.append(note.pitch)
                if len(distinct) >= options.min_notes:
                    return True
        return False

    def _settle(self, credit: bool) -> None:
        """The current run's pending frames into the short memory, each with its age's decay: as held notes
        (``credit``; the long memory, which counted them as not held, counts them as held too) or not."""
        for number in self._pending:
            age = self._count - number
            weight = self._recent_decay**age
            self._recent_periodic += weight
            if credit:
                self._recent_held += weight
                self._held += self._decay**age
        self._pending.clear()

    def _setup(self, frame: int) -> None:
        ms = SAMPLE_RATE / 1000
        self._frame = frame
        self._flat_frames = max(2, math.ceil(self.options.flat_ms * ms / frame) + 1)
        self._long_frames = max(1, math.ceil(self.options.long_run_ms * ms / frame))
        self._undecided_frames = max(1, math.ceil(self.options.undecided_ms * ms / frame))
        self._evidence = self.options.min_evidence_ms * ms / frame
        self._note_frames = max(2, math.ceil(self.options.note_ms * ms / frame) + 1)
        self._memory_frames = math.ceil(self.options.memory_ms * ms / frame)
        self._opening = self._memory_frames
        self._decay = math.exp(-frame / (self.options.memory_ms * ms))
        self._recent_decay = math.exp(-frame / (self.options.recent_ms * ms))
        self._pitches = deque(
            maxlen=max(self._flat_frames, self._long_frames, self._undecided_frames, self._note_frames)
        )

    def _within(self, frames: int, semitones: float) -> bool:
        """Whether the last ``frames`` frames were all periodic with their pitches within ``semitones`` of each
        other, an octave either way allowed (a tracker's octave jump is not a new note)."""
        if len(self._pitches) < frames:
            return False
        recent = list(self._pitches)[-frames:]
        latest = recent[-1]
        if latest is None or None in recent:
            return False
        steps = [p - latest for p in recent if p is not None]
        folded = [s - 12.0 * round(s / 12.0) for s in steps]
        return max(folded) - min(folded) <= semitones

    def _analyse(self, frames: npt.NDArray[np.float32]) -> tuple[list[float], list[bool]]:
        """Each frame's pitch (semitones, MIDI numbering) and whether it is periodic, from the last 64 ms."""
        n = len(frames)
        # 1. Each frame's analysis window is the last _N_WINDOW samples of the stream up to the frame's end.
        windows = self._trailing.of(frames)
        # 2. The autocorrelation of the band, normalised by the energy and unbiased by the window's own.
        power = np.abs(np.fft.rfft(windows * self._window, n=_N_FFT, axis=1)) ** 2
        power[:, self._outside] = 0.0
        ac = np.fft.irfft(power, n=_N_FFT, axis=1)
        energy = ac[:, 0]
        loud = np.add.reduce(windows[:, -_N_WINDOW // 2 :] ** 2, axis=1) / (_N_WINDOW // 2) >= _SILENT
        r = ac[:, _MIN_LAG - 1 : _MAX_LAG + 2] * self._unbias / np.maximum(energy, 1e-30)[:, None]
        # 3. The period: the first local peak nearly as high as the best (a multiple of the period is as high).
        inner = r[:, 1:-1]
        peak = (inner >= r[:, :-2]) & (inner > r[:, 2:])
        best = np.max(np.where(peak, inner, -1.0), axis=1)
        candidate = peak & (inner >= _NEAR_BEST * best[:, None])
        first = np.argmax(candidate, axis=1)
        rows = np.arange(n)
        left, centre, right = r[rows, first], r[rows, first + 1], r[rows, first + 2]
        # parabolic interpolation between the lags either side: the pitch to a hundredth of a semitone
        curvature = left - 2 * centre + right
        offset = np.where(curvature < 0, 0.5 * (left - right) / np.where(curvature < 0, curvature, -1.0), 0.0)
        lag = _MIN_LAG + first + np.clip(offset, -0.5, 0.5)
        pitch = 69.0 + 12.0 * np.log2(SAMPLE_RATE / lag / 440.0)
        periodic = loud & (best > 0) & (centre >= self.options.min_periodicity)
        return pitch.tolist(), periodic.tolist()
