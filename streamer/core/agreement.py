"""Deciding which words are stable: the two commit policies, and the hallucination guards that run before them.

LocalAgreement-n (Polak et al. 2022; Machacek et al. 2023, whisper_streaming): a word is committed once the last
``n`` hypotheses for the same audio agree on it and on everything before it. Committed words are never revised.

AlignAtt (Papi et al. 2023, "AlignAtt: Using Attention-based Audio-Translation Alignments as a Guide for
Simultaneous Speech Translation"; ufal SimulStreaming): a word is committed once the decoder's cross-attention has
moved past it, i.e. its alignment ends at least a margin before the end of the audio decoded. The alignment is the
one the engine computes for word timings (the alignment heads' cross-attention, through DTW), so the policy commits
in one decode what LocalAgreement-2 needs two for; only the words near the end of the audio, which the model may
still be hearing, wait for the next window.

Auto: LocalAgreement while a stream's windows come a step apart, AlignAtt for a window decoded after a longer gap.
LocalAgreement's cost is a second decode of the same words; on an idle engine that is one step (half a second), but
when the engine is busy a stream's windows coalesce and come seconds apart, and two of them is what the speaker
waits.

Guards: Whisper hallucinates on silence and noise (a high no-speech probability with a low average log-probability,
the rule of openai/whisper ``transcribe.py``; or a high no-speech probability on a short text, the stock phrases of
its training subtitles: "Thank you.", "You", which come out confident, a text's length counted up to where it starts
looping, so "Bye bye bye ..." on music is one word; or a short text the model is unsure of, with silence the
likelier; or no word with a letter or digit in it, the lone "." it writes on music), and loops ("thank you thank you
..."; a gzip compression ratio above 2.4, the same file). Two successive loops can agree with each other, so a loop
is cut from a hypothesis *before* agreement ever sees it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Protocol

from streamer.core.errors import ConfigError
from streamer.core.events import Word

__all__ = [
    "Agreement",
    "AlignAtt",
    "AutoCommit",
    "CommitPolicy",
    "GuardOptions",
    "LocalAgreement",
    "Policy",
    "Verdict",
    "check_result",
    "is_spoken",
    "normalize_word",
    "spoken_before_loop",
    "strip_committed_overlap",
    "truncate_loops",
]

_PUNCT = re.compile(r"[^\w']+|(?<!\w)'|'(?!\w)")


def normalize_word(text: str) -> str:
    """Lower case without punctuation: what two hypotheses must share for a word to agree."""
    return _PUNCT.sub("", text.lower())


@dataclass(frozen=True)
class GuardOptions:
    """When a decode result is not trusted. Validated in :meth:`validate`."""

    # a result is silence when no_speech_prob is above this ...
    no_speech_threshold: float = 0.6
    # ... and its average log-probability is below this (openai/whisper's rule)
    logprob_threshold: float = -1.0
    # ... or it has at most this many words, whatever its log-probability (0: openai/whisper's rule alone). Issue 16:
    # on kitchen noise and ringback that the VAD let through, tiny.en said "Thank you." and "You" with no_speech_prob
    # 0.61 to 0.85 and avg_logprob -0.2 to -0.9, so the rule above kept them
    hallucination_max_words: int = 3
    # a short text (hallucination_max_words) below logprob_threshold is silence once its no-speech probability is
    # above this: the model is unsure of the words and thinks silence the likelier. Issue 39: at a stream's first
    # second of plucked and hold music, tiny.en wrote "Thank you." (0.55, -1.11) and "A" (0.58, -1.92); the short
    # texts of real speech below -1 (the accuracy bench's tuning half) reached 0.49 ("The person...", a partial)
    unsure_no_speech_threshold: float = 0.5
    # gzip compression ratio of the text above this is a loop
    compression_ratio_threshold: float = 2.4
    # loops of phrases up to this many words are detected
    max_loop_words: int = 8
    # a phrase repeated this many times in a row is a loop
    min_loop_repeats: int = 3
    # a hypothesis of at least this many words in which one n-gram (n <= 3) makes up most words is a loop
    dominance_min_words: int = 12

    def validate(self) -> None:
        if not 0.0 <= self.no_speech_threshold <= 1.0:
            raise ConfigError("no_speech_threshold must be between 0 and 1")
        if not 0.0 <= self.unsure_no_speech_threshold <= 1.0:
            raise ConfigError("unsure_no_speech_threshold must be between 0 and 1")
        if self.hallucination_max_words < 0:
            raise ConfigError("hallucination_max_words must be >= 0")
        if self.compression_ratio_threshold <= 1.0:
            raise ConfigError("compression_ratio_threshold must be above 1")
        if self.max_loop_words < 1:
            raise ConfigError("max_loop_words must be >= 1")
        if self.min_loop_repeats < 2:
            raise ConfigError("min_loop_repeats must be >= 2")
        if self.dominance_min_words < 4:
            raise ConfigError("dominance_min_words must be >= 4")


class Verdict(Enum):
    """Whether a decode result may contribute words."""

    OK = "ok"
    NO_SPEECH = "no_speech"
    LOOP = "loop"  # compression ratio too high


def is_spoken(text: str) -> bool:
    """Whether a word says anything: it holds a letter or a digit (in any script). Punctuation alone does not."""
    return any(c.isalnum() for c in text)


def check_result(
    options: GuardOptions,
    no_speech_prob: float,
    avg_logprob: float,
    compression_ratio: float,
    words: int | None = None,
) -> Verdict:
    """Judge a whole result from its scores and its number of spoken ``words`` (:func:`spoken_before_loop`; None: not
    judged on it); only :attr:`Verdict.OK` results may be used. A result without a spoken word is no speech whatever its
    scores: on guitar music tiny.en writes a lone "." with a no-speech probability under the threshold. A short text
    the model is unsure of is no speech from the lower ``unsure_no_speech_threshold`` on."""
    if words == 0:
        return Verdict.NO_SPEECH
    short = words is not None and words <= options.hallucination_max_words
    unsure = avg_logprob < options.logprob_threshold
    if no_speech_prob > options.no_speech_threshold and (unsure or short):
        return Verdict.NO_SPEECH
    if short and unsure and no_speech_prob > options.unsure_no_speech_threshold:
        return Verdict.NO_SPEECH
    if compression_ratio > options.compression_ratio_threshold:
        return Verdict.LOOP
    return Verdict.OK


def _loop_cut(options: GuardOptions, keys: Sequence[str]) -> int | None:
    """Index just after the first occurrence of the earliest phrase repeated min_loop_repeats times in a row (a
    single word once more than that: people say "words, words, words" and "no no no"; issue 16)."""
    for i in range(len(keys)):
        for size in range(1, options.max_loop_words + 1):
            repeats = options.min_loop_repeats + (size == 1)
            if i + size * repeats > len(keys):
                break
            phrase = list(keys[i : i + size])
            if all(list(keys[i + r * size : i + (r + 1) * size]) == phrase for r in range(1, repeats)):
                return i + size
    return None


def spoken_before_loop(options: GuardOptions, texts: Sequence[str]) -> int:
    """How many of ``texts`` (a hypothesis's words) are spoken (:func:`is_spoken`) before it starts looping: what
    :func:`check_result` judges a hypothesis's length by. On plucked and hold music nobody tuned on, tiny.en wrote
    "Bye bye bye bye bye bye bye bye bye" and "Beep beep beep beep be" with no-speech probabilities of 0.66 to 0.98;
    counted whole they were too long for the short-text rule, and the loop cut then showed "Bye" and "Beep"
    (issue 39). Cut first, they are one word each, and a stock phrase."""
    cut = _loop_cut(options, [normalize_word(t) for t in texts])
    return sum(1 for t in texts[:cut] if is_spoken(t))


def truncate_loops(options: GuardOptions, words: Sequence[Word]) -> tuple[Word, ...]:
    """Cut a hypothesis where it starts looping, keeping the first occurrence of the repeated phrase.

    A loop is a phrase of 1..max_loop_words words repeated min_loop_repeats times in a row (one word: once more); a
    hypothesis in which a single 1-3 word n-gram covers more than half of the words is refused entirely.
    """
    keys = [normalize_word(w.text) for w in words]
    cut = _loop_cut(options, keys)
    if cut is not None:
        words, keys = words[:cut], keys[:cut]
    if len(keys) >= options.dominance_min_words:
        for n in (1, 2, 3):
            grams = Counter(tuple(keys[i : i + n]) for i in range(len(keys) - n + 1))
            _, count = grams.most_common(1)[0]
            if count * n > len(keys) / 2 and count >= options.min_loop_repeats:
                return ()
    return tuple(words)


def strip_committed_overlap(committed_tail: Sequence[str], words: Sequence[Word], max_ngram: int = 5) -> list[Word]:
    """Drop leading words that repeat the last committed words (Whisper re-reads the window's first word)."""
    tail = [normalize_word(t) for t in committed_tail]
    keys = [normalize_word(w.text) for w in words]
    for n in range(min(max_ngram, len(tail), len(keys)), 0, -1):
        if tail[-n:] == keys[:n]:
            return list(words[n:])
    return list(words)


@dataclass(frozen=True)
class Agreement:
    """The outcome of one hypothesis: words committed now (never revised) and the unstable rest."""

    committed: tuple[Word, ...]
    tail: tuple[Word, ...]


class Policy(StrEnum):
    """Which commit policy a stream uses."""

    LOCAL_AGREEMENT = "local-agreement"
    ALIGNATT = "alignatt"
    AUTO = "auto"


class CommitPolicy(Protocol):
    """What the stream core asks of a commit policy, whichever it is."""

    @property
    def latest(self) -> tuple[Word, ...]: ...

    def update(self, hypothesis: Sequence[Word], audio_end: int, commit: bool = True) -> Agreement: ...

    def advance(self, count: int) -> None: ...

    def drop_before(self, position: int) -> None: ...

    def reset(self) -> None: ...


class LocalAgreement:
    """LocalAgreement-n over successive hypotheses of the same (uncommitted) audio.

    Call :meth:`update` with each new hypothesis: the words after everything committed so far, with absolute times.
    Call :meth:`reset` when the utterance ends (its words are committed by the caller).
    """

    def __init__(self, n: int = 2, margin: int = 0) -> None:
        if n < 1:
            raise ConfigError("agreement_n must be >= 1")
        if margin < 0:
            raise ConfigError("the agreement margin must be >= 0")
        self.n = n
        # an agreed word is committed only once it ends at least this many samples before the decoded audio does
        self.margin = margin
        self._history: list[tuple[Word, ...]] = []

    @property
    def latest(self) -> tuple[Word, ...]:
        """The newest hypothesis, less what has been committed since."""
        return self._history[-1] if self._history else ()

    def update(self, hypothesis: Sequence[Word], audio_end: int = 0, commit: bool = True) -> Agreement:
        """``audio_end`` is where the decoded audio ends (absolute samples): with a margin, agreed words that end
        within it of ``audio_end`` wait (two windows a short step apart agree easily on a guess at the edge). With
        ``commit`` false the agreed words are reported but kept, as if not committed: the caller holds them back
        (the next hypotheses must agree on them again, which a longer window may revise)."""
        self._history.append(tuple(hypothesis))
        self._history = self._history[-self.n :]
        newest = self._history[-1]
        if len(self._history) < self.n:
            return Agreement((), newest)
        keyed = [[normalize_word(w.text) for w in h] for h in self._history]
        agreed = 0
        for column in zip(*keyed, strict=False):
            if any(k != column[0] for k in column):
                break
            agreed += 1
        if self.margin:
            while agreed and newest[agreed - 1].end > audio_end - self.margin:
                agreed -= 1
        if commit:
            self.advance(agreed)
        return Agreement(newest[:agreed], newest[agreed:])

    def advance(self, count: int) -> None:
        """``count`` leading words were committed: drop them from every stored hypothesis."""
        self._history = [h[count:] for h in self._history]

    def drop_before(self, position: int) -> None:
        """Audio before ``position`` was committed some other way: forget words that start before it."""
        self._history = [tuple(w for w in h if w.start >= position) for h in self._history]

    def reset(self) -> None:
        self._history = []


class AlignAtt:
    """AlignAtt over the word alignments of each hypothesis: the leading words whose alignment ends at least
    ``margin`` samples before the end of the decoded audio are committed; the rest is the unstable tail.

    Same calls as :class:`LocalAgreement`; :meth:`update` needs ``audio_end``, the absolute sample where the window
    just decoded ends.
    """

    def __init__(self, margin: int) -> None:
        if margin < 0:
            raise ConfigError("the AlignAtt margin must be >= 0")
        self.margin = margin
        self._latest: tuple[Word, ...] = ()

    @property
    def latest(self) -> tuple[Word, ...]:
        return self._latest

    def update(self, hypothesis: Sequence[Word], audio_end: int, commit: bool = True) -> Agreement:
        """With ``commit`` false the settled words are reported but stay in :attr:`latest`."""
        words = tuple(hypothesis)
        horizon = audio_end - self.margin
        settled = 0
        # stop at the first word the attention has not moved past: a later word cannot be settled before it
        while settled < len(words) and words[settled].end <= horizon:
            settled += 1
        self._latest = words[settled:] if commit else words
        return Agreement(words[:settled], words[settled:])

    def advance(self, count: int) -> None:
        self._latest = self._latest[count:]

    def drop_before(self, position: int) -> None:
        self._latest = tuple(w for w in self._latest if w.start >= position)

    def reset(self) -> None:
        self._latest = ()


class AutoCommit:
    """:class:`LocalAgreement` for a hypothesis whose window ends at most ``gap`` samples after the previous one's
    (the first: after ``start``, where the utterance was heard), :class:`AlignAtt` for one after a longer gap (the
    stream waited for a busy engine). LocalAgreement keeps every hypothesis, less what AlignAtt commits, so it can
    take over at the next window; AlignAtt decides each window from that window alone, so only LocalAgreement is
    told what was committed or dropped (:attr:`latest` is LocalAgreement's).

    Same calls as :class:`LocalAgreement`.
    """

    def __init__(self, local: LocalAgreement, alignatt: AlignAtt, gap: int, start: int = 0) -> None:
        if gap < 0:
            raise ConfigError("the auto policy's gap must be >= 0")
        self.local = local
        self.alignatt = alignatt
        self.gap = gap
        self._previous_end = start

    @property
    def latest(self) -> tuple[Word, ...]:
        return self.local.latest

    def uses_alignatt(self, audio_end: int) -> bool:
        """Whether the hypothesis of a window ending at ``audio_end`` is decided by AlignAtt."""
        return audio_end - self._previous_end > self.gap

    def update(self, hypothesis: Sequence[Word], audio_end: int, commit: bool = True) -> Agreement:
        by_alignatt = self.uses_alignatt(audio_end)
        self._previous_end = max(self._previous_end, audio_end)
        if not by_alignatt:
            return self.local.update(hypothesis, audio_end, commit)
        agreement = self.alignatt.update(hypothesis, audio_end, commit)
        # LocalAgreement keeps the hypothesis for the next window to agree with, less what AlignAtt committed
        self.local.update(hypothesis, audio_end, commit=False)
        if commit and agreement.committed:
            self.local.drop_before(agreement.committed[-1].end)
        return agreement

    def advance(self, count: int) -> None:
        self.local.advance(count)

    def drop_before(self, position: int) -> None:
        self.local.drop_before(position)

    def reset(self) -> None:
        """Forget the hypotheses (the windows' timing stays: the next gap is still measured from the last one)."""
        self.local.reset()
