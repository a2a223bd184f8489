"""Where a :class:`~streamer.core.stream.StreamCore` starts in its stream: :class:`StreamOrigin`, at 0 for a new
stream, further on for a core that takes a stream over from another (:mod:`streamer.server.resume`).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.core.errors import ConfigError
from streamer.core.events import Word
from streamer.core.units import N_SAMPLES

__all__ = ["StreamOrigin"]


@dataclass(frozen=True)
class StreamOrigin:
    """Where a core starts in its stream: at 0 for a new stream; further on when it takes over a stream another
    core (another process: :mod:`streamer.server.resume`) accounted for up to ``start``.

    A core taking over mid-utterance needs the audio the other core's windows would have re-read: ``replay_from``
    (that core's :attr:`StreamCore.context_start`) is where the audio it is fed begins. What lies in
    ``[replay_from, start)`` is context only: it goes through the VAD and into the windows, and nothing in it is
    accounted again (no event ends at or before ``start``, no ``SpeechStarted`` for an utterance begun before it);
    the words decoded there are dropped as the other core would have dropped them. Without it, decoding restarts
    mid-utterance, often mid-word, with no acoustic context, and whole phrases come out wrong (issue 18)."""

    # 16 kHz samples before this position are all accounted for by Final, NonSpeech or Lost events already
    start: int = 0
    # the segment_id of this core's first segment (the other core's next one)
    segment_id: int = 0
    # the last committed words before ``start``: the prompt of the first windows, and what overlap removal compares
    context: tuple[Word, ...] = ()
    # the stream position of the first sample the core is fed: at or before ``start`` and at most one model window
    # (30 s) before it; None: ``start`` (no context)
    replay_from: int | None = None

    @property
    def first_sample(self) -> int:
        """The stream position of the first sample fed to the core."""
        return self.start if self.replay_from is None else self.replay_from

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.start < 0 or self.segment_id < 0:
            raise ConfigError("a stream origin's start and segment_id must be >= 0")
        if not max(0, self.start - N_SAMPLES) <= self.first_sample <= self.start:
            raise ConfigError("replay_from must be at or before start, and at most 30 s (one window) before it")
