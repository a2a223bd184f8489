from __future__ import annotations

import pytest

from streamer.core.agreement import (
    AlignAtt,
    AutoCommit,
    GuardOptions,
    LocalAgreement,
    Verdict,
    check_result,
    is_spoken,
    normalize_word,
    spoken_before_loop,
    strip_committed_overlap,
    truncate_loops,
)
from streamer.core.errors import ConfigError
from streamer.core.events import Word

G = GuardOptions()


def words(text: str) -> list[Word]:
    return [Word(t, i * 100, i * 100 + 80, 0.9) for i, t in enumerate(text.split())]


def texts(ws: tuple[Word, ...] | list[Word]) -> str:
    return " ".join(w.text for w in ws)


def test_normalize_ignores_case_and_punctuation() -> None:
    assert normalize_word("Hello,") == normalize_word("hello") == "hello"
    assert normalize_word("don't") == "don't"
    assert normalize_word("'quoted'") == "quoted"


def test_local_agreement_2_commits_the_common_prefix_once() -> None:
    la = LocalAgreement(2)
    first = la.update(words("the cat"))
    assert first.committed == () and texts(first.tail) == "the cat"
    second = la.update(words("The cat sat"))
    assert texts(second.committed) == "The cat" and texts(second.tail) == "sat"
    # the next hypothesis covers only uncommitted audio
    third = la.update(words("sat on the mat"))
    assert texts(third.committed) == "sat" and texts(third.tail) == "on the mat"


def test_local_agreement_n_needs_n_hypotheses() -> None:
    la = LocalAgreement(3)
    assert la.update(words("a b")).committed == ()
    assert la.update(words("a b c")).committed == ()
    assert texts(la.update(words("a x")).committed) == "a"
    with pytest.raises(ConfigError):
        LocalAgreement(0)


def test_an_agreed_word_within_the_margin_of_the_window_end_waits() -> None:
    la = LocalAgreement(2, margin=150)
    la.update(words("a b c"), audio_end=300)
    # "a b c" agreed; c ends at 280 and b at 180, within 150 of the end (300): only "a" (ends at 80) is committed
    agreed = la.update(words("a b c d"), audio_end=300)
    assert texts(agreed.committed) == "a" and texts(agreed.tail) == "b c d"
    # once the audio goes on, the rest commits as the next windows agree
    assert texts(la.update(words("b c d e"), audio_end=600).committed) == "b c d"
    with pytest.raises(ConfigError):
        LocalAgreement(2, margin=-1)


def test_disagreement_commits_nothing() -> None:
    la = LocalAgreement(2)
    la.update(words("hello world"))
    assert la.update(words("yellow world")).committed == ()


@pytest.mark.parametrize(
    ("no_speech", "logprob", "ratio", "words", "verdict"),
    [
        (0.9, -1.5, 1.2, None, Verdict.NO_SPEECH),
        (0.9, -0.2, 1.2, None, Verdict.OK),  # confident text despite a high no-speech probability
        (0.9, -0.2, 1.2, 8, Verdict.OK),  # ... and long enough to be speech
        # the stock hallucinations, measured on noise the VAD let through (issue 16): short, confident, no speech
        (0.79, -0.86, 0.58, 2, Verdict.NO_SPEECH),  # "Thank you." on kitchen noise
        (0.72, -0.22, 0.33, 1, Verdict.NO_SPEECH),  # "You" on a ringback tone
        (0.5, -0.22, 0.33, 1, Verdict.OK),  # a short word the model thinks is speech
        # issue 39: unsure short texts at the first second of plucked and hold music, silence the likelier
        (0.55, -1.11, 0.58, 2, Verdict.NO_SPEECH),  # "Thank you."
        (0.58, -1.92, 0.2, 1, Verdict.NO_SPEECH),  # "A"
        (0.49, -1.08, 0.5, 2, Verdict.OK),  # "The person...": real speech, unsure too, but speech the likelier
        (0.58, -0.9, 0.2, 1, Verdict.OK),  # sure of its word
        (0.58, -1.92, 0.5, 4, Verdict.OK),  # four words are not a stock phrase
        (0.3, -0.5, 0.4, 0, Verdict.NO_SPEECH),  # "." on guitar music: no spoken word, whatever the scores
        (0.1, -0.2, 3.0, None, Verdict.LOOP),
        (0.1, -0.2, 1.5, None, Verdict.OK),
    ],
)
def test_result_guards(no_speech: float, logprob: float, ratio: float, words: int | None, verdict: Verdict) -> None:
    assert check_result(G, no_speech, logprob, ratio, words) is verdict


def test_a_word_is_spoken_when_it_holds_a_letter_or_digit() -> None:
    assert all(is_spoken(w) for w in ["a", "Hello,", "42", "'tis", "你好", "été."])
    assert not any(is_spoken(w) for w in [".", "...", "-", "?!", "♪", ""])


def test_a_repeated_phrase_is_cut_after_its_first_occurrence() -> None:
    cut = truncate_loops(G, words("so I said thank you thank you thank you thank you"))
    assert texts(cut) == "so I said thank you"
    assert texts(truncate_loops(G, words("no no no no"))) == "no"
    assert texts(truncate_loops(G, words("a very very good day"))) == "a very very good day"
    # one word said three times is speech; a phrase of two is a loop at three
    assert texts(truncate_loops(G, words("some more words words words and that is all"))) == (
        "some more words words words and that is all"
    )
    assert texts(truncate_loops(G, words("you know you know you know it"))) == "you know"


def test_a_hypothesis_is_as_long_as_what_it_says_before_it_loops() -> None:
    # what the short-text guard counts (issue 39: tiny.en on plucked music, no-speech probability 0.9)
    assert spoken_before_loop(G, [" Bye"] + [" bye"] * 8) == 1  # words as decoded, with their spaces
    assert spoken_before_loop(G, ["Beep", "beep", "beep", "beep", "be"]) == 1
    assert spoken_before_loop(G, ["so", "I", "said", "thank", "you", "thank", "you", "thank", "you"]) == 5
    assert spoken_before_loop(G, ["Oh", ".", "yes", "yes", "yes", "yes"]) == 2  # punctuation says nothing
    assert spoken_before_loop(G, ["no", "no", "no", "no", "more"]) == 1
    assert spoken_before_loop(G, ["no", "no", "no", "more"]) == 4  # three times is speech
    assert spoken_before_loop(G, []) == 0


def test_a_dominating_ngram_refuses_the_hypothesis() -> None:
    looped = words("the end the and the end the but the end the of the end the so")
    assert truncate_loops(G, looped) == ()
    normal = words("it was the best of times it was the worst of times it was the age of wisdom")
    assert len(truncate_loops(G, normal)) == len(normal)


def test_overlap_with_committed_words_is_removed() -> None:
    assert texts(strip_committed_overlap(["the", "lazy", "dog"], words("dog, barked loudly"))) == "barked loudly"
    assert texts(strip_committed_overlap(["cat"], words("dog barked"))) == "dog barked"


def test_guard_options_validate() -> None:
    with pytest.raises(ConfigError):
        GuardOptions(min_loop_repeats=1).validate()
    with pytest.raises(ConfigError, match="unsure_no_speech_threshold"):
        GuardOptions(unsure_no_speech_threshold=1.5).validate()


def test_alignatt_commits_in_one_hypothesis_the_words_the_attention_has_moved_past() -> None:
    policy = AlignAtt(margin=150)
    # words end at 80, 180, 280, 380; audio decoded up to 400: the horizon is 250
    first = policy.update(words("the cat sat down"), audio_end=400)
    assert texts(first.committed) == "the cat" and texts(first.tail) == "sat down"
    assert texts(policy.latest) == "sat down"
    # the next window's hypothesis covers only what is not committed
    policy.advance(0)
    later = policy.update(words("x x sat down on")[2:], audio_end=600)
    assert texts(later.committed) == "sat down" and texts(later.tail) == "on"


def test_alignatt_stops_at_the_first_word_still_heard() -> None:
    # a word whose alignment runs into the margin holds back every word after it, even one aligned earlier (DTW
    # alignments are monotonic, but clipped or overlapping words must not reorder what is committed)
    hypothesis = [Word("a", 0, 80, 0.9), Word("b", 100, 390, 0.9), Word("c", 120, 200, 0.9)]
    result = AlignAtt(margin=100).update(hypothesis, audio_end=400)
    assert texts(result.committed) == "a" and texts(result.tail) == "b c"
    assert AlignAtt(margin=0).update(hypothesis, audio_end=400).committed == tuple(hypothesis)
    with pytest.raises(ConfigError):
        AlignAtt(margin=-1)


def test_alignatt_forgets_words_committed_some_other_way() -> None:
    policy = AlignAtt(margin=1000)
    policy.update(words("one two three"), audio_end=300)
    policy.drop_before(100)
    assert texts(policy.latest) == "two three"
    policy.reset()
    assert policy.latest == ()


def _auto(gap: int = 500, start: int = 0) -> AutoCommit:
    return AutoCommit(LocalAgreement(2), AlignAtt(margin=150), gap=gap, start=start)


def test_auto_agrees_while_windows_come_a_step_apart() -> None:
    policy = _auto()
    # the utterance's first window ends 400 samples after its start (within the gap): LocalAgreement, which has
    # nothing to agree with yet (AlignAtt would have committed "the cat")
    assert not policy.uses_alignatt(400)
    first = policy.update(words("the cat sat down"), audio_end=400)
    assert first.committed == ()
    assert not policy.uses_alignatt(700)
    second = policy.update(words("the cat sad down on"), audio_end=700)
    assert texts(second.committed) == "the cat" and texts(second.tail) == "sad down on"
    assert not policy.uses_alignatt(1000)
    third = policy.update(words("x x sad down on it")[2:], audio_end=1000)
    assert texts(third.committed) == "sad down on" and texts(third.tail) == "it"
    assert texts(policy.latest) == "it"


def test_auto_commits_by_attention_after_a_long_gap() -> None:
    policy = _auto()
    policy.update(words("a"), audio_end=200)
    policy.update(words("a b"), audio_end=400)  # LocalAgreement commits "a"
    policy.advance(1)
    # the engine kept the stream waiting: the next window ends 1100 samples later and decides alone what the
    # attention has moved past (horizon 1350: "b" to "m", which end at 180 to 1280), though no window agreed
    assert policy.uses_alignatt(1500)
    late = policy.update(words("x b c d e f g h i j k l m n o")[1:], audio_end=1500)
    assert texts(late.committed) == "b c d e f g h i j k l m" and texts(late.tail) == "n o"
    assert texts(policy.latest) == "n o"
    # LocalAgreement takes over from what AlignAtt left: the next close window agrees on the rest it repeats
    assert not policy.uses_alignatt(1700)
    after = policy.update(words("x x x x x x x x x x x x x n o p")[13:], audio_end=1700)
    assert texts(after.committed) == "n o" and texts(after.tail) == "p"


def test_auto_measures_the_first_gap_from_the_utterance_start() -> None:
    # a first window that ends long after its utterance started waited for the engine: AlignAtt decides it
    policy = _auto(start=0)
    assert policy.uses_alignatt(600)
    assert texts(policy.update(words("a b c d e f"), audio_end=600).committed) == "a b c d"
    # a reset (a failed window) forgets the hypotheses, not when the last window ended
    policy.reset()
    assert policy.latest == ()
    assert not policy.uses_alignatt(900)
    assert policy.update(words("x x x x e f g")[4:], audio_end=900).committed == ()
    with pytest.raises(ConfigError):
        _auto(gap=-1)
