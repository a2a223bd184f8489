"""What a window is decoded with besides its own new audio: the committed text spoken before it, as the prompt
(:func:`prompt_before`), and the committed sentence its audio may start at, before the utterance
(:func:`sentence_start_before`). Both read the stream's recent committed words, oldest first.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamer.core.events import Word

__all__ = ["SENTENCE_ENDS", "ends_sentence", "prompt_before", "sentence_start_before"]

SENTENCE_ENDS = (".", "?", "!")  # a word ending so ends a sentence


def ends_sentence(word: Word) -> bool:
    """Whether ``word`` ends a sentence."""
    return word.text.endswith(SENTENCE_ENDS)


def sentence_start_before(committed: Sequence[Word], start: int, context: int) -> int | None:
    """Where the windows of an utterance starting at ``start`` may start, at most ``context`` samples before it: at the
    first committed word there that begins a sentence (between it and the word before), or None if none does. A
    window cut inside a word or a sentence derails the decoder: tiny.en wrote nothing at all for 3 s of speech after
    a window that started at "there" with the prompt "The boy was"."""
    first = next(
        (
            i
            for i, w in enumerate(committed)
            if w.start >= start - context and w.end <= start and (i == 0 or ends_sentence(committed[i - 1]))
        ),
        None,
    )
    if first is None:
        return None
    before = committed[first - 1].end if first else committed[first].start
    return (before + committed[first].start) // 2


def prompt_before(committed: Sequence[Word], window_start: int, max_chars: int) -> str:
    """The committed text spoken before the window, at most ``max_chars`` of it, cut at a word: text the window itself
    re-reads must not be in the prompt, or the model takes it as already said and skips it."""
    if max_chars == 0:
        return ""
    text = " ".join(w.text for w in committed if w.end <= window_start)
    if len(text) <= max_chars:
        return text
    cut = text[-max_chars:]
    space = cut.find(" ")
    return cut[space + 1 :] if space >= 0 else cut
