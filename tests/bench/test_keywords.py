from __future__ import annotations

from pathlib import Path

import pytest

from streamer.bench.keywords import (
    DISTRACTORS,
    UTTERANCES,
    Condition,
    KeywordScore,
    conditions,
    count_phrase,
    keyword_lists,
    score,
)
from streamer.offline.normalize import normalize_english


def test_conditions_are_none_the_glossary_and_one_per_positive_bonus() -> None:
    assert conditions([2.0, 0.0, 4.5]) == [
        Condition("none", False, 0.0),
        Condition("glossary", True, 0.0),
        Condition("glossary + bonus 2", True, 2.0),
        Condition("glossary + bonus 4.5", True, 4.5),
    ]


def test_each_utterance_gets_its_own_words_and_distractors_it_does_not_hold() -> None:
    utterances = (("a", ("Polly", "kine")), ("b", ("polly", "Liddy")), ("c", ("tabu",)), ("d", ("kine", "yawn")))
    lists = keyword_lists(utterances, distractors=2)
    assert lists[0] == (("Polly", "kine"), ("Liddy", "tabu"))  # "polly" is Polly: not a distractor of a
    assert lists[1] == (("polly", "Liddy"), ("tabu", "kine"))
    assert lists[3] == (("kine", "yawn"), ("Polly", "Liddy"))  # the list wraps around
    assert keyword_lists(utterances, distractors=2) == lists  # the same words every run


def test_the_bench_s_own_lists_are_well_formed(shared_data: Path) -> None:
    references = dict(
        line.split("\t")[:2]
        for line in (shared_data / "librispeech" / "transcripts.tsv").read_text(encoding="utf-8").splitlines()[1:]
    )
    for (name, own), (_, others) in zip(UTTERANCES, keyword_lists(UTTERANCES), strict=True):
        reference = normalize_english(references[name]).split()
        for word in own:  # every rare word is said in its utterance
            assert count_phrase(reference, normalize_english(word).split()) >= 1, (name, word)
        assert len(others) == DISTRACTORS
        assert not {w.lower() for w in others} & {w.lower() for w in own}


@pytest.mark.parametrize(
    ("words", "phrase", "count"),
    [("a b a b a", "a b", 2), ("a a a", "a a", 1), ("x y", "", 0), ("", "a", 0), ("a b", "a b c", 0)],
)
def test_count_phrase_counts_non_overlapping_occurrences(words: str, phrase: str, count: int) -> None:
    assert count_phrase(words.split(), phrase.split()) == count


def test_score_counts_recall_and_distractors_written_where_they_were_not_said() -> None:
    reference = "POLLY SAID POLLY WAS THERE AND THE KINE"
    hypothesis = "Polly said, poly was there. And the kind Liddy, Liddy."
    result = score(reference, hypothesis, ["Polly", "kine"], ["Liddy", "there"], normalize_english)
    # Polly said twice, found once; kine not found; Liddy written twice unsaid; "there" was said
    assert result == KeywordScore(found=1, said=3, false_alarms=2)
    assert score(reference, reference, ["Polly", "kine"], [], normalize_english) == KeywordScore(3, 3, 0)
