from __future__ import annotations

from streamer.core.context import ends_sentence, prompt_before, sentence_start_before
from streamer.core.events import Word

SR = 16000


def words(*spec: tuple[str, float, float]) -> list[Word]:
    return [Word(text, int(start * SR), int(end * SR), 0.9) for text, start, end in spec]


COMMITTED = words(("The", 0.0, 0.2), ("boy", 0.3, 0.5), ("ran.", 0.6, 0.9), ("Then", 1.2, 1.4), ("he", 1.5, 1.6))


def test_a_word_ending_in_a_full_stop_question_or_exclamation_mark_ends_a_sentence() -> None:
    assert [ends_sentence(w) for w in words(("ran.", 0, 1), ("why?", 0, 1), ("oh!", 0, 1), ("and,", 0, 1))] == [
        True,
        True,
        True,
        False,
    ]


def test_the_prompt_holds_only_text_spoken_before_the_window() -> None:
    assert prompt_before(COMMITTED, int(1.0 * SR), 200) == "The boy ran."
    assert prompt_before(COMMITTED, 0, 200) == ""


def test_the_prompt_is_cut_at_a_word_to_its_bound() -> None:
    assert prompt_before(COMMITTED, 2 * SR, 10) == "Then he"  # "an. Then he" less the cut word
    assert prompt_before(COMMITTED, 2 * SR, 0) == ""


def test_context_starts_between_a_sentence_end_and_the_next_word() -> None:
    start = 2 * SR
    assert sentence_start_before(COMMITTED, start, 10 * SR) == 0  # the first committed word begins a sentence
    assert sentence_start_before(COMMITTED, start, int(1.5 * SR)) == (int(0.9 * SR) + int(1.2 * SR)) // 2


def test_no_context_is_taken_from_inside_a_sentence() -> None:
    assert sentence_start_before(COMMITTED, 2 * SR, int(0.6 * SR)) is None  # only "he" is that close
