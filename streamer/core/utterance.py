"""The items a :class:`~streamer.core.stream.StreamCore` accounts for, in stream order: an :class:`Utterance` (one span
of speech, committed word by word) or a :class:`Gap` (non-speech waiting for the speech before it to be committed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from streamer.core.agreement import CommitPolicy, LocalAgreement
from streamer.core.events import Word
from streamer.core.windowing import Window

__all__ = ["Gap", "Heard", "Utterance"]


@dataclass(frozen=True)
class Heard:
    """What one decoded window heard: its words in stream time, after the guards, and their language."""

    window: Window
    words: tuple[Word, ...]
    language: str


@dataclass
class Utterance:
    """One VAD speech span (or the part of it before a forced finalisation), in stream order."""

    start: int
    speech_end: int  # end of its speech received so far
    committed: int  # accounting position: Final/Lost events cover [start, committed)
    decoded: int  # end of the last window sent
    # where the next window's wait is measured from (see CoreOptions.late_context_ms): where the VAD reported the
    # utterance, then the end of each window sent
    paced: int = -1
    closed: bool = False  # no more audio will join it
    anchor: int = -1  # where its windows start (utterance start, later a trim point at or before ``committed``)
    sentence_end: int = -1  # end of the last committed word that ends a sentence
    agreement: CommitPolicy = field(default_factory=LocalAgreement)
    partial_text: str = ""
    # the language its windows are decoded in, once its first words are committed (None: each window detects it)
    language: str | None = None
    # the language of its latest decoded window (what its uncommitted hypothesis is in)
    heard: str = ""
    # its closed windows resume here, where the last one's decoding stopped early (-1: none did); see resume_after_ms
    resume: int = -1
    resumes: int = 0
    # the latest decoded window, while it covers all the speech heard so far (CoreOptions.close_ahead): an end point
    # with no more speech closes the utterance with its words
    covered: Heard | None = None

    def move_anchor(self, limit: int, committed: Sequence[Word] = (), context: int = 0) -> None:
        """Keep windows short enough: once the windows would be longer than ``limit`` samples (``trim_after_ms``),
        start them after the last committed sentence. Past twice the limit, start them mid-sentence, at the first
        of the ``committed`` words (the stream's recent ones) that starts at most ``context`` samples
        (``trim_context_ms``) before the commit point: the model hears the words leading up to the new audio, not a
        cut word. Call after each commit."""
        length = self.speech_end - self.anchor
        if length <= limit:
            return
        if self.anchor < self.sentence_end <= self.committed:
            self.anchor = self.sentence_end
        elif length > 2 * limit:
            since = max(self.anchor, self.committed - context)
            self.anchor = next((w.start for w in committed if since <= w.start < self.committed), self.committed)


@dataclass
class Gap:
    """Non-speech audio waiting for the speech before it to be committed."""

    start: int
    end: int
