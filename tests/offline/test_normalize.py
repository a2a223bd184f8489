from __future__ import annotations

import random

import pytest

from streamer.offline.normalize import (
    WerResult,
    WordEdit,
    edit_operations,
    english_normalizer,
    normalize_basic,
    normalize_english,
    word_edits,
    word_error_rate,
)


def test_english_normaliser_matches_whisper_conventions() -> None:
    assert normalize_english("Mr. Smith paid twenty-two dollars, didn't he?") == "mister smith paid $22 did not he"
    # LibriSpeech references are upper case without punctuation; a hypothesis with punctuation normalises the same
    assert normalize_english("AND SO MY FELLOW AMERICANS") == normalize_english("And so, my fellow Americans!")


def test_english_normaliser_drops_fillers_and_bracketed_text() -> None:
    assert normalize_english("Um, I think [laughs] so, uh.") == "i think so"


def test_british_spellings_score_as_american_when_the_map_is_installed() -> None:
    from streamer.offline.normalize import spelling_map_source

    if spelling_map_source().startswith("none"):
        pytest.skip("openai-whisper's spelling map is not installed (pip install --no-deps openai-whisper)")
    assert normalize_english("He counselled the colour") == "he counseled the color"
    assert english_normalizer({"colour": "color"})("Colour") == "color"


def test_without_the_map_spellings_stay_and_the_source_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamer.offline import normalize

    monkeypatch.setattr(normalize, "_whisper_spelling_file", lambda: None)  # as if openai-whisper were absent
    normalize._english.cache_clear()  # the normaliser is built once per process: build it without the map
    try:
        assert normalize.spelling_map_source().startswith("none (pip install --no-deps openai-whisper")
        assert normalize_english("He counselled the colour") == "he counselled the colour"
    finally:
        normalize._english.cache_clear()  # the next caller builds it again, with the map where it is installed


def test_basic_normaliser_keeps_words_of_any_language() -> None:
    assert normalize_basic("¿Qué tal, Señor?") == "qué tal señor"
    assert normalize_basic("Hello (world)!") == "hello"


def test_edit_operations_counts_each_kind() -> None:
    assert edit_operations(["a", "b", "c", "d"], ["a", "x", "c", "d", "e"]) == (1, 0, 1)
    assert edit_operations(["a", "b", "c", "d"], ["a", "c", "d"]) == (0, 1, 0)
    assert edit_operations([], ["a"]) == (0, 0, 1)
    assert edit_operations(["a"], []) == (0, 1, 0)


def test_word_edits_say_where_each_edit_is() -> None:
    assert word_edits(["a", "b", "c", "d"], ["a", "x", "c", "d", "e"]) == [
        WordEdit("substitution", 1, 1),
        WordEdit("insertion", 4, 4),
    ]
    assert word_edits(["a", "b", "c", "d"], ["a", "c", "d"]) == [WordEdit("deletion", 1, 1)]
    assert word_edits(["a", "b"], ["a", "x", "b"]) == [WordEdit("insertion", 1, 1)]
    assert word_edits(["a"], []) == [WordEdit("deletion", 0, 0)]
    assert word_edits([], ["a"]) == [WordEdit("insertion", 0, 0)]
    assert word_edits(["a", "b"], ["a", "b"]) == []


def test_word_edits_count_what_edit_operations_counts() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ref = [rng.choice("abcd") for _ in range(rng.randrange(8))]
        hyp = [rng.choice("abcd") for _ in range(rng.randrange(8))]
        edits = word_edits(ref, hyp)
        kinds = tuple(sum(e.kind == kind for e in edits) for kind in ("substitution", "deletion", "insertion"))
        assert kinds == edit_operations(ref, hyp), (ref, hyp)
        # replaying the edits turns the reference into the hypothesis
        rebuilt, at = [], 0
        for edit in edits:
            rebuilt.extend(ref[at : edit.ref_index])
            at = edit.ref_index
            if edit.kind == "insertion":
                rebuilt.append(hyp[edit.hyp_index])
            elif edit.kind == "substitution":
                rebuilt.append(hyp[edit.hyp_index])
                at += 1
            else:
                at += 1
        rebuilt.extend(ref[at:])
        assert rebuilt == hyp, (ref, hyp, edits)


def test_word_error_rate_is_pooled_over_utterances() -> None:
    result = word_error_rate(["the cat sat", "on the mat"], ["the cat sat", "on a mat here"])
    assert result == WerResult(wer=pytest.approx(2 / 6), substitutions=1, deletions=0, insertions=1, words=6)
    assert result.errors == 2


def test_word_error_rate_with_empty_references() -> None:
    assert word_error_rate([""], [""]).wer == 0.0
    assert word_error_rate([""], ["thank you"]).wer == 1.0


def test_results_add_up() -> None:
    total = word_error_rate(["a b"], ["a"]) + word_error_rate(["c d"], ["c d e"])
    assert (total.deletions, total.insertions, total.words, total.wer) == (1, 1, 4, 0.5)


def test_agrees_with_jiwer() -> None:
    jiwer = pytest.importorskip("jiwer")
    refs = ["the quick brown fox jumps over the lazy dog", "a b c d e f", "one two three"]
    hyps = ["the quick brown box jumped over lazy dog dog", "a c d x e", "one two three four five"]
    measures = jiwer.process_words(refs, hyps)
    ours = word_error_rate(refs, hyps)
    assert ours.wer == pytest.approx(measures.wer)
    assert ours.errors == measures.substitutions + measures.deletions + measures.insertions


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        word_error_rate(["a"], [])
