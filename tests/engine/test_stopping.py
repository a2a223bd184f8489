from __future__ import annotations

from streamer.engine.stopping import BASE_TOKENS, is_looping, token_budget
from streamer.engine.types import DecodeOptions


def test_the_budget_follows_the_window_length_when_asked() -> None:
    assert token_budget(DecodeOptions(), 16000 * 5, 400) == 224
    rated = DecodeOptions(max_tokens_per_second=12.0)
    assert token_budget(rated, 16000 * 5, 400) == BASE_TOKENS + 60
    assert token_budget(rated, 16000 * 30, 400) == 224  # never past max_new_tokens
    assert token_budget(rated, 16000 * 30, 100) == 100  # nor past what the context leaves
    assert token_budget(rated, None, 400) == 224  # no length known: max_new_tokens


def test_a_phrase_repeated_three_times_is_a_loop() -> None:
    phrase = [11, 12, 13, 14, 15]
    assert is_looping([1, 2, *phrase, *phrase, *phrase], 3)
    assert not is_looping([1, 2, *phrase, *phrase], 3)
    assert not is_looping([1, 2, *phrase, *phrase, *phrase, 99], 3)  # only endings: checked after every token
    assert not is_looping([7, 7, 7], None)


def test_a_loop_of_short_runs_must_span_eight_tokens() -> None:
    # "words, words, words," is three runs of two tokens: speech, not a loop; a fourth makes it 8 tokens
    words = [50, 11]
    assert not is_looping([1, *words * 3], 3)
    assert is_looping([1, *words * 4], 3)
    assert not is_looping([7] * 7, 3)
    assert is_looping([7] * 8, 3)
    assert is_looping([21, 22, 23] * 3, 3)  # 9 tokens


def test_runs_longer_than_the_longest_period_are_not_looked_for() -> None:
    phrase = list(range(100, 117))  # 17 tokens
    assert not is_looping(phrase * 3, 3)
    assert is_looping(phrase[:16] * 3, 3)
