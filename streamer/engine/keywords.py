"""A session's prompt and keywords, as the decoder sees them: the text put before the committed text in every
window's prompt, and the keyword tokens the logit filters boost (:mod:`streamer.engine.filters`). No torch here.

Whisper conditions each window on "previous text" between ``<|startofprev|>`` and ``<|startoftranscript|>``
(openai/whisper ``transcribe.py``, ``initial_prompt``): spellings, names and style found there are copied. A session's
prompt is the keywords as a glossary, then its initial prompt, then the committed text the window follows; when the
prompt holds more than ``max_prompt_tokens``, the oldest committed text goes first, then the start of the session's
part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamer.engine.types import DecodeOptions

__all__ = ["KeywordTrie", "glossary", "prompt_tokens", "session_prompt"]


def glossary(keywords: Sequence[str]) -> str:
    """The keywords as one sentence of the prompt: ``Glossary: a, b, c.``; empty for none."""
    words = [k.strip() for k in keywords if k.strip()]
    return f"Glossary: {', '.join(words)}." if words else ""


def session_prompt(options: DecodeOptions) -> str:
    """What a session asked every window to be conditioned on: its keywords' glossary, then its initial prompt."""
    return " ".join(part for part in (glossary(options.keywords), options.initial_prompt.strip()) if part)


def prompt_tokens(encode: Callable[[str], list[int]], options: DecodeOptions, committed: str) -> list[int]:
    """The prompt's tokens (without ``<|startofprev|>``): the session's part, then ``committed`` text, at most
    ``options.max_prompt_tokens`` of them, keeping the session's part and cutting the oldest committed text first.
    ``encode`` is the tokenizer's; each part is encoded after a space, as Whisper encodes its prompt."""
    limit = options.max_prompt_tokens
    session = session_prompt(options)
    head = encode(" " + session) if session and limit > 0 else []
    tail = encode(" " + committed.strip()) if committed.strip() and limit > 0 else []
    if len(head) >= limit:
        return head[len(head) - limit :]
    room = limit - len(head)
    return head + tail[max(0, len(tail) - room) :]


@dataclass(frozen=True)
class KeywordTrie:
    """The tokens that go on spelling a keyword after a given tail of decoded tokens. Build with :meth:`of`."""

    # tokens that a keyword starts with (boosted at every step)
    first: frozenset[int]
    # the token prefix of a keyword -> the tokens that may follow it
    following: dict[tuple[int, ...], frozenset[int]]
    # the longest prefix in ``following``
    depth: int

    @classmethod
    def of(cls, encode: Callable[[str], list[int]], keywords: Sequence[str]) -> KeywordTrie:
        """Each keyword encoded as a word in running text (after a space), as the model would write it."""
        sequences = [encode(" " + k.strip()) for k in keywords if k.strip()]
        first = frozenset(s[0] for s in sequences if s)
        following: dict[tuple[int, ...], set[int]] = {}
        for seq in sequences:
            for cut in range(1, len(seq)):
                following.setdefault(tuple(seq[:cut]), set()).add(seq[cut])
        depth = max((len(p) for p in following), default=0)
        return cls(first, {p: frozenset(t) for p, t in following.items()}, depth)

    def next_tokens(self, sequence: Sequence[int]) -> set[int]:
        """The tokens to boost after ``sequence`` (the tokens decoded so far): every keyword's first token, and the
        next token of each keyword whose first tokens end ``sequence``."""
        tokens = set(self.first)
        for length in range(1, min(self.depth, len(sequence)) + 1):
            tokens |= self.following.get(tuple(sequence[-length:]), frozenset())
        return tokens
