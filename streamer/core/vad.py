"""Voice activity detection: a frame classifier plus hysteresis, padding and an adaptive energy gate.

Sans-I/O: :class:`VoiceActivityDetector` takes 16 kHz float32 audio in chunks of any size and returns labelled spans
of absolute stream samples. Labels are final when returned: a span is only labelled once no later audio can change
it, so non-speech is reported ``pad_before_ms`` (plus the start-trigger window) late, and speech right away.

The frame classifier is a seam (:class:`FrameClassifier`), chosen by :attr:`VadOptions.backend`: WebRTC's GMM voice
detector (:class:`WebRtcClassifier`, the default, built in: no model) or the Silero neural network
(:class:`streamer.engine.silero_vad.SileroClassifier`, which lives with the other models). The core never imports a
model (issue 38): a model-backed backend's :data:`ClassifierFactory` is handed in from above, in a table by backend
(:data:`streamer.engine.silero_vad.CLASSIFIERS`) that whoever makes the detector passes to :func:`make_classifier`
(or to :class:`~streamer.core.stream.StreamCore`). Everything around the classifier, hysteresis, padding and the
tiling of the stream into spans, is the same for both. Their figures side by side are in
docs/benchmarks.md, section vad; docs/operations.md says why webrtc is still the default.

Why the energy gate (webrtc only): webrtcvad flags most stationary noise (kitchen noise, an "empty" room recording) as
voiced. Requiring a voiced frame to stand ``energy_gate_db`` (6 dB) above a running noise floor (the 10th percentile of
the last ``noise_floor_ms`` (10 s) of frame energies, "minimum statistics", Martin 2001) removes those while keeping
speech, whose energy is syllabic. Music passes both tests (76 % of the shared guitar's music, which Silero rejects
whole; 72 % with the music detector below); the model writes no word for it, but it costs decodes. Fast continuous
speech is a weakness: with few pauses in the floor's history the floor rises to the speech itself. With 3 s and 9 dB
(the defaults before issue 16) the gate dropped 40 % of a spontaneous conversation's speech (docs/benchmarks.md, section
vad); 10 s and 6 dB, with 500 ms of padding before speech, kept 98 % of the speech time of the shared LibriSpeech runs
and conversation against 89 %, and took 1.8 % of the shared and generated noise (tones apart) for speech against 0.8 %,
which the no-speech guards then drop. That was one ad-hoc measurement, not a repo command: `streamer bench vad` does not
compare gate settings yet; the defaults were chosen on `streamer bench accuracy` (docs/benchmarks.md, section accuracy).
Silero's network does not take stationary noise for speech, so it runs without the gate.

Steady tones (DTMF digits, ringback, dial, busy and fax tones: webrtcvad voices them, and tiny.en read a ringback as
"Beep") are unvoiced whatever the backend: :class:`~streamer.core.tonal.ToneDetector` sees every frame
(``reject_tones``). So are music and wordless singing (issue 39: tiny.en wrote "Beep, beep" on plucked strings and
"YO-HOO-HOO HOOO" on a sung melody): :class:`~streamer.core.music.MusicDetector` flags the frames of a stream that is
holding notes (``reject_music``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError, InvalidState
from streamer.core.music import MusicDetector
from streamer.core.tonal import ToneDetector
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "ClassifierFactory",
    "FrameClassifier",
    "SlidingPercentile",
    "SpeechEnd",
    "VadBackend",
    "VadEvent",
    "VadOptions",
    "VadSpan",
    "VoiceActivityDetector",
    "WebRtcClassifier",
    "make_classifier",
]

_FLOOR_PERCENTILE = 10.0
_FLOOR_WARMUP_FRAMES = 1  # before this many frames the floor is the absolute one below
_BLOCK_FRAMES = 64  # frames analysed at once (about 2 s of 30 ms frames)
_ABSOLUTE_FLOOR_DB = 40.0  # 10*log10(mean square of int16 samples): about -50 dBFS


class VadBackend(StrEnum):
    """Which frame classifier tells voiced frames from the rest (``streamer serve --vad``)."""

    WEBRTC = "webrtc"  # WebRTC's GMM voice detector (webrtcvad): microseconds a frame
    SILERO = "silero"  # Silero VAD's neural network (pip install 'streamer[silero]'), see streamer.engine.silero_vad


@dataclass(frozen=True)
class VadOptions:
    """How speech is told from non-speech. Validated in :meth:`validate`."""

    # the frame classifier (`streamer bench vad` measures both; docs/operations.md says why webrtc is the default)
    backend: VadBackend = VadBackend.WEBRTC
    # webrtc: webrtcvad mode, 0 lets most audio through as speech, 3 is the most aggressive at rejecting non-speech
    aggressiveness: int = 2
    # webrtc: analysis frame (webrtcvad accepts 10, 20 or 30 ms); silero's frame is its model's, 32 ms
    frame_ms: int = 30
    # silero: a frame is voiced when the model's speech probability is at least this (0.5 is Silero's own default)
    silero_threshold: float = 0.5
    # speech spans start this much before the first voiced frame (keeps soft onsets)
    pad_before_ms: int = 500
    # speech spans end this much after the last voiced frame (hangover; keeps soft endings)
    pad_after_ms: int = 300
    # speech starts once this much voiced audio falls within a window twice as long (rejects clicks)
    min_speech_ms: int = 120
    # a speech span ends after this much unvoiced audio (the endpoint); at least pad_after_ms is kept as padding
    min_silence_ms: int = 500
    # webrtc: a voiced frame must be this many dB above the running noise floor; None disables the gate
    energy_gate_db: float | None = 6.0
    # webrtc: the noise floor is the 10th percentile of the frame energies of this much recent audio
    noise_floor_ms: int = 10000
    # a frame that is a steady tone of one or two sinusoids (DTMF, ringback, dial tone) is unvoiced: see core/tonal.py
    reject_tones: bool = True
    # a frame of a stream that is holding notes (music, wordless singing) is unvoiced: see core/music.py (issue 39)
    reject_music: bool = True

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.backend not in tuple(VadBackend):
            raise ConfigError(f"vad backend must be one of {', '.join(VadBackend)}")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ConfigError("vad aggressiveness must be 0, 1, 2 or 3")
        if self.frame_ms not in (10, 20, 30):
            raise ConfigError("vad frame_ms must be 10, 20 or 30")
        for name in ("pad_before_ms", "pad_after_ms"):
            if not 0 <= getattr(self, name) <= 2000:
                raise ConfigError(f"vad {name} must be between 0 and 2000")
        if not self.frame_ms <= self.min_speech_ms <= 1000:
            raise ConfigError(f"vad min_speech_ms must be between frame_ms ({self.frame_ms}) and 1000")
        if not self.frame_ms <= self.min_silence_ms <= 10000:
            raise ConfigError(f"vad min_silence_ms must be between frame_ms ({self.frame_ms}) and 10000")
        if self.energy_gate_db is not None and not 0 <= self.energy_gate_db <= 40:
            raise ConfigError("vad energy_gate_db must be between 0 and 40, or null")
        if not 500 <= self.noise_floor_ms <= 30000:
            raise ConfigError("vad noise_floor_ms must be between 500 and 30000")
        if not 0.0 < self.silero_threshold < 1.0:
            raise ConfigError("vad silero_threshold must be between 0 and 1")


@dataclass(frozen=True)
class VadSpan:
    """``[start, end)`` is speech (part of the current speech span) or non-speech. Spans arrive contiguous."""

    start: int
    end: int
    speech: bool


@dataclass(frozen=True)
class SpeechEnd:
    """The current speech span ended at ``position`` (a pause of ``min_silence_ms``, or end of input)."""

    position: int


VadEvent = VadSpan | SpeechEnd


class FrameClassifier(Protocol):
    """One stream's frame-level voice detector, under the detector's hysteresis: whole frames in, voiced flags out.

    It may keep state from frame to frame (a recurrent model does): make one per stream (:func:`make_classifier`) and
    give it that stream's frames in order, each once."""

    @property
    def frame_samples(self) -> int:
        """Samples in one frame (16 kHz); :meth:`classify` is only ever given whole frames."""
        ...

    def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        """The stream's next frames, shaped ``(n, frame_samples)``, float32 in [-1, 1]: whether each is voiced."""
        ...


ClassifierFactory = Callable[["VadOptions"], FrameClassifier]
"""Makes one stream's :class:`FrameClassifier` of a backend from the stream's :class:`VadOptions` (its threshold, its
frame). Called once per stream; a model it runs is loaded once per process, by the factory's own module."""


def _pcm16(frames: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    # np.clip(np.round(frames * 32768.0), -32768, 32767), in place and by the ufuncs themselves: np.round to no
    # decimals is np.rint and np.clip is maximum then minimum, but both go through Python wrappers (issue 37)
    scaled = frames * np.float32(32768.0)
    np.rint(scaled, out=scaled)
    np.maximum(scaled, np.float32(-32768.0), out=scaled)
    np.minimum(scaled, np.float32(32767.0), out=scaled)
    return scaled.astype("<i2")


def _load_webrtcvad(aggressiveness: int) -> Any:
    try:
        import webrtcvad
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ConfigError("voice activity detection needs webrtcvad: pip install webrtcvad-wheels") from exc
    return webrtcvad.Vad(aggressiveness)


class WebRtcClassifier:
    """WebRTC's GMM voice detector (``VadBackend.WEBRTC``): stateless from the caller's side, 16-bit PCM frames."""

    def __init__(self, aggressiveness: int = 2, frame_ms: int = 30) -> None:
        self._vad = _load_webrtcvad(aggressiveness)
        self._frame = frame_ms * SAMPLE_RATE // 1000

    @property
    def frame_samples(self) -> int:
        return self._frame

    def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        pcm = _pcm16(frames).tobytes()  # one copy, sliced: not one array and one copy per frame
        step = 2 * self._frame
        voiced = (bool(self._vad.is_speech(pcm[i : i + step], SAMPLE_RATE)) for i in range(0, len(pcm), step))
        return np.fromiter(voiced, dtype=np.bool_, count=len(frames))


def make_classifier(
    options: VadOptions, classifiers: Mapping[VadBackend, ClassifierFactory] | None = None
) -> FrameClassifier:
    """A new frame classifier of ``options.backend`` for one stream (the detector makes its own when given none).

    WebRTC's is built in. A model-backed backend (silero) is made by its factory in ``classifiers``, which the caller
    takes from the package that holds the model (:data:`streamer.engine.silero_vad.CLASSIFIERS`): the core cannot
    import it (issue 38). Raises :class:`~streamer.core.errors.ConfigError` when ``options.backend`` has no factory.
    """
    factory = classifiers.get(options.backend) if classifiers is not None else None
    if factory is not None:
        return factory(options)
    if options.backend is VadBackend.WEBRTC:
        return WebRtcClassifier(options.aggressiveness, options.frame_ms)
    raise ConfigError(
        f"the {options.backend} voice activity detector runs a model, which the core does not load: make it with "
        "the classifiers of streamer.engine.silero_vad.CLASSIFIERS (make_classifier, StreamCore's vad_classifiers)"
    )


class SlidingPercentile:
    """The ``q``-th percentile of the last ``size`` values appended, as ``np.percentile`` computes it (linear
    interpolation between the two nearest ranks; the same float operations, so the same bits), kept in a sorted
    list as the values arrive: a frame costs a binary search and a short memmove, where ``np.percentile`` copied and
    partitioned the whole window every frame (333 energies for the gate's 10 s: 0.15 ms a frame; `streamer bench
    vad` put the webrtc detector at 17.2 CPU s per stream-hour before, 14.4 after, on 2 shared cores)."""

    def __init__(self, size: int, q: float) -> None:
        if size < 1 or not 0.0 <= q <= 100.0:
            raise ValueError("a sliding percentile needs size >= 1 and q between 0 and 100")
        self._window: deque[float] = deque()
        self._sorted: list[float] = []
        self._size = size
        self._q = q / 100

    def __len__(self) -> int:
        return len(self._window)

    def append(self, value: float) -> None:
        """Add ``value``, dropping the oldest once ``size`` are held."""
        if len(self._window) == self._size:
            del self._sorted[bisect_left(self._sorted, self._window.popleft())]
        self._window.append(value)
        insort(self._sorted, value)

    def value(self) -> float:
        """The percentile of the values held (at least one)."""
        ranked = self._sorted
        n = len(ranked)
        virtual = (n - 1) * self._q
        if virtual >= n - 1:
            return ranked[-1]
        below = math.floor(virtual)
        a, b = ranked[below], ranked[below + 1]
        gamma = virtual - below
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


class VoiceActivityDetector:
    """Label a 16 kHz stream as speech / non-speech with hysteresis.

    Call :meth:`process` with each chunk, in order, and act on the returned events (speech spans to decode,
    non-speech spans to account). At end of input call :meth:`flush` once: it labels everything still undecided.
    Every sample received is labelled exactly once, so the spans tile ``[0, samples_received)`` after flush.

    ``classifier`` tells voiced frames from the rest; by default a new one of ``options.backend``
    (:func:`make_classifier`, which builds WebRTC's alone: pass a model-backed backend's classifier in). It belongs
    to this detector's stream alone.
    """

    def __init__(self, options: VadOptions | None = None, classifier: FrameClassifier | None = None) -> None:
        self.options = options = options or VadOptions()
        options.validate()
        self._classifier = classifier if classifier is not None else make_classifier(options)
        self._frame = frame = self._classifier.frame_samples
        ms = SAMPLE_RATE // 1000
        self._pad_before = options.pad_before_ms * ms
        self._pad_after = min(options.pad_after_ms, options.min_silence_ms) * ms
        self._min_silence = options.min_silence_ms * ms
        self._need = math.ceil(options.min_speech_ms * ms / frame)  # voiced frames to start
        self._window = 2 * self._need  # ... within this many frames
        self._ring: deque[tuple[int, bool]] = deque(maxlen=self._window)  # (frame index, voiced)
        self._tones = ToneDetector() if options.reject_tones else None
        self._music = MusicDetector() if options.reject_music else None
        self._gate_db = options.energy_gate_db if options.backend is VadBackend.WEBRTC else None
        self._energies = SlidingPercentile(max(1, options.noise_floor_ms * ms // frame), _FLOOR_PERCENTILE)
        self._reset_frame = 0  # no trigger window may reach before this frame
        self._pending = np.zeros(0, dtype=np.float32)  # samples of an incomplete frame
        self._frames = 0  # complete frames analysed
        self._received = 0
        self._decided = 0  # everything before this has been labelled
        self._in_speech = False
        self._last_voiced_end = 0
        self._flushed = False

    @property
    def samples_received(self) -> int:
        return self._received

    @property
    def frame_samples(self) -> int:
        """The classifier's frame: frames are analysed from the first sample on, on this grid."""
        return self._frame

    @property
    def decided(self) -> int:
        """Every sample before this position has been labelled."""
        return self._decided

    @property
    def paused(self) -> bool:
        """In speech, and the unvoiced audio since its last voiced frame has outlasted ``pad_after_ms``: the speech
        span has stopped growing, and ends where it stands unless a voiced frame comes before ``min_silence_ms``."""
        return self._in_speech and self._frames * self._frame - self._last_voiced_end >= self._pad_after

    def process(self, samples: npt.ArrayLike) -> list[VadEvent]:
        """Analyse the next chunk (float32 mono 16 kHz, any length); return the events it decided, in order."""
        if self._flushed:
            raise InvalidState("VoiceActivityDetector.process() after flush()")
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._received += x.size
        buf = np.concatenate([self._pending, x]) if self._pending.size else x
        n_frames = buf.size // self._frame
        self._pending = buf[n_frames * self._frame :].copy()
        events: list[VadEvent] = []
        # analysed a block at a time: a chunk's frames at once cost ~46 bytes per sample in temporaries (24 MB for a
        # 1 MiB frame of /v1/listen, and diarization runs a second detector on it); a block's are bounded
        for first in range(0, n_frames, _BLOCK_FRAMES):
            count = min(_BLOCK_FRAMES, n_frames - first)
            self._analyse(buf[first * self._frame : (first + count) * self._frame].reshape(count, self._frame), events)
        return events

    def _analyse(self, frames: npt.NDArray[np.float32], events: list[VadEvent]) -> None:
        """One block of whole frames, in stream order: each frame's verdict, and the events they decide."""
        # the mean square as np.mean takes it (the sum, then one division), without its Python wrapper
        energy = (
            10.0 * np.log10(np.add.reduce(_pcm16(frames).astype(np.float64) ** 2, axis=1) / self._frame + 1.0)
            if self._gate_db is not None
            else np.zeros(len(frames))
        )
        voiced = self._classifier.classify(frames)
        if self._tones is not None:
            # the tone detector sees every frame (its verdict compares each with the one before), the chunk's
            # frames in one call: numpy's per-call overhead was most of its cost frame by frame (issue 37)
            voiced = voiced & ~self._tones.tones(frames)
        if self._music is not None:
            # it too sees every frame: its verdict is the stream's recent past, pauses included
            voiced = voiced & ~self._music.music(frames)
        for v, e in zip(voiced.tolist(), energy.tolist(), strict=True):
            self._frame_decided(v, e, events)

    def flush(self) -> list[VadEvent]:
        """End of input: label everything undecided (a trailing partial frame included) and close open speech."""
        if self._flushed:
            return []
        self._flushed = True
        events: list[VadEvent] = []
        end = self._received
        if self._in_speech:
            speech_end = min(end, self._last_voiced_end + self._pad_after)
            self._emit(speech_end, True, events)
            events.append(SpeechEnd(max(speech_end, self._decided)))
            self._in_speech = False
        self._emit(end, False, events)
        return events

    # --- internals -------------------------------------------------------------------------------------------------

    def _emit(self, end: int, speech: bool, events: list[VadEvent]) -> None:
        if end <= self._decided:
            return
        last = events[-1] if events else None
        if isinstance(last, VadSpan) and last.speech == speech and last.end == self._decided:
            events[-1] = VadSpan(last.start, end, speech)
        else:
            events.append(VadSpan(self._decided, end, speech))
        self._decided = end

    def _gate(self, energy: float) -> bool:
        gate = self._gate_db
        if gate is None:
            return True
        warm = len(self._energies) >= _FLOOR_WARMUP_FRAMES
        return energy > (self._energies.value() if warm else _ABSOLUTE_FLOOR_DB) + gate

    def _frame_decided(self, classified_voiced: bool, energy: float, events: list[VadEvent]) -> None:
        n = self._frames
        self._frames += 1
        voiced = classified_voiced and self._gate(energy)
        self._energies.append(energy)
        self._ring.append((n, voiced))
        start, end = n * self._frame, (n + 1) * self._frame
        if self._in_speech:
            if voiced:
                self._last_voiced_end = end
                self._emit(end, True, events)
                return
            hang_end = self._last_voiced_end + self._pad_after
            self._emit(min(end, hang_end), True, events)
            if end - self._last_voiced_end >= self._min_silence:
                # 1. the pause is long enough: the span ends after its hangover
                events.append(SpeechEnd(max(hang_end, self._decided)))
                self._in_speech = False
                # 2. a new start may not reuse frames of this span
                self._ring.clear()
                self._reset_frame = n + 1
            return
        window = [(i, v) for i, v in self._ring if i >= self._reset_frame]
        voiced_frames = [i for i, v in window if v]
        if len(voiced_frames) >= self._need:
            # speech starts pad_before ahead of the first voiced frame of the triggering window
            first = voiced_frames[0] * self._frame
            self._emit(max(self._decided, first - self._pad_before), False, events)
            self._emit(end, True, events)
            self._in_speech = True
            self._last_voiced_end = end
            return
        # no future trigger window can start before this frame, so audio before it (less padding) is non-speech
        earliest = max(n + 2 - self._window, self._reset_frame)
        self._emit(min(start, earliest * self._frame - self._pad_before), False, events)
