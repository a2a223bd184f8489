"""When a hypothesis stops before end-of-text: a token budget from the window's length, and a loop detector.

Whisper sometimes repeats a phrase until it runs out of tokens (a 5 s window can take 224 decoder passes). A stream
server pays for that in latency for every stream sharing the engine, and its guards cut a loop at the first
occurrence of the repeated phrase anyway (:func:`streamer.core.agreement.truncate_loops`); so decoding stops as soon as
the loop is certain. Both rules are off unless :class:`~streamer.engine.types.DecodeOptions` asks for them.
"""

from __future__ import annotations

import math

from streamer.core.units import SAMPLE_RATE
from streamer.engine.types import DecodeOptions

__all__ = ["BASE_TOKENS", "MAX_PERIOD", "MIN_LOOP_TOKENS", "is_looping", "token_budget"]

# tokens every window may sample whatever its length (the timestamps and a few words)
BASE_TOKENS = 16
# the longest repeated run of text tokens looked for (a phrase of about 8 words)
MAX_PERIOD = 16
# a loop of short runs must span at least this many tokens: people say "words, words, words" (3 runs of 2 tokens) and
# "no no no", and stopping there lost the rest of the window ("... and that should be all. Thanks.", issue 16); a
# hallucinated loop runs on for dozens of tokens, so waiting for 8 costs a few decoder passes at most
MIN_LOOP_TOKENS = 8


def token_budget(options: DecodeOptions, num_samples: int | None, room: int) -> int:
    """How many tokens a window of ``num_samples`` samples may sample, ``room`` being what the context leaves."""
    budget = min(options.max_new_tokens, room)
    if options.max_tokens_per_second is not None and num_samples is not None:
        by_length = BASE_TOKENS + math.ceil(options.max_tokens_per_second * num_samples / SAMPLE_RATE)
        budget = min(budget, by_length)
    return max(1, budget)


def is_looping(text_tokens: list[int], repeats: int | None) -> bool:
    """Whether ``text_tokens`` (no timestamps or specials) end in a run of 1..:data:`MAX_PERIOD` tokens repeated
    ``repeats`` times in a row, and for at least :data:`MIN_LOOP_TOKENS` tokens in all. Call after each new text
    token: only endings are checked."""
    if repeats is None:
        return False
    length = len(text_tokens)
    for period in range(1, min(MAX_PERIOD, length // repeats) + 1):
        needed = max(repeats, -(-MIN_LOOP_TOKENS // period))
        if needed * period > length:
            continue
        last = text_tokens[length - period :]
        if all(text_tokens[length - (r + 1) * period : length - r * period] == last for r in range(1, needed)):
            return True
    return False
