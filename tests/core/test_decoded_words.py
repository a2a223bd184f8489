from __future__ import annotations

from streamer.core.agreement import GuardOptions
from streamer.core.decoded_words import clip, new_words, resume_point, words_heard
from streamer.core.events import Word
from streamer.core.requests import DecodeResult, SegmentResult, WordTiming
from streamer.core.utterance import Utterance
from streamer.core.windowing import Window

SR = 16000
GUARDS = GuardOptions()


def result(*spec: tuple[str, int, int], no_speech_prob: float = 0.1) -> DecodeResult:
    timings = tuple(WordTiming(word, start, end, 0.9) for word, start, end in spec)
    segment = SegmentResult(0, spec[-1][2] if spec else 0, "", (), timings)
    return DecodeResult(1, "", "en", (segment,), -0.3, no_speech_prob, 1.2, 0.0)


def word(text: str, start: float, end: float) -> Word:
    return Word(text, int(start * SR), int(end * SR), 0.9)


def test_words_are_placed_in_stream_time_and_clipped_to_the_window() -> None:
    window = Window(10 * SR, 12 * SR, final=False)
    heard = words_heard(result((" one", 0, SR), (" ", SR, SR), (" two", SR, 3 * SR)), window, GUARDS)
    assert heard == [Word("one", 10 * SR, 11 * SR, 0.9), Word("two", 11 * SR, 12 * SR, 0.9)]


def test_a_result_the_guards_do_not_trust_has_no_words() -> None:
    window = Window(0, 2 * SR, final=False)
    assert words_heard(result((" .", 0, SR)), window, GUARDS) == []  # nothing spoken
    assert words_heard(result((" Thank", 0, SR), (" you.", SR, 2 * SR), no_speech_prob=0.9), window, GUARDS) == []


def test_a_looping_result_is_judged_by_what_it_says_before_the_loop() -> None:
    # issue 39: on plucked music nobody tuned on, tiny.en wrote "Bye bye bye ..." with a no-speech probability of 0.9:
    # nine words, too many for the short-text guard, and "Bye" reached the client after the loop cut
    window = Window(0, 3 * SR, final=False)
    looped = [(" Bye" if i == 0 else " bye", i * SR // 3, (i + 1) * SR // 3) for i in range(9)]
    assert words_heard(result(*looped, no_speech_prob=0.9), window, GUARDS) == []
    # with a low no-speech probability it is heard (new_words cuts the loop) ...
    assert len(words_heard(result(*looped, no_speech_prob=0.1), window, GUARDS)) == 9
    # ... and so are four words said before a loop, whatever the no-speech probability
    said = [(" so", 0, 1), (" I", 1, 2), (" said", 2, 3), (" thanks", 3, 4)] + [
        (" thanks", 4 + i, 5 + i) for i in range(4)
    ]
    assert len(words_heard(result(*said, no_speech_prob=0.9), window, GUARDS)) == 8


def test_only_words_after_the_commit_point_are_new() -> None:
    head = Utterance(0, 3 * SR, SR, 3 * SR, anchor=0)
    heard = [word("one", 0.1, 0.9), word("two", 1.1, 1.9), word("three", 2.1, 2.9)]
    assert new_words(heard, head, [word("one", 0.1, 0.9)], GUARDS) == heard[1:]


def test_a_closing_window_whose_words_stop_early_resumes_after_its_last_word_but_one() -> None:
    head = Utterance(0, 10 * SR, 0, 10 * SR, closed=True, anchor=0)
    window = Window(0, 10 * SR, final=True)
    heard = [word("one", 0.1, 0.9), word("day", 1.0, 1.5), word("and", 1.6, 1.8)]
    assert resume_point(head, window, heard, [], 2 * SR, GUARDS) == int(1.5 * SR)
    assert resume_point(head, window, heard, [], 0, GUARDS) is None  # resume_after_ms 0: never
    head.resumes = 4
    assert resume_point(head, window, heard, [], 2 * SR, GUARDS) is None  # at most four times


def test_clip_keeps_a_word_inside_its_span() -> None:
    assert clip(word("x", 0.5, 2.5), SR, 2 * SR) == Word("x", SR, 2 * SR, 0.9)
    assert clip(word("x", 3.0, 4.0), SR, 2 * SR) == Word("x", 2 * SR, 2 * SR, 0.9)


def test_a_resumed_window_drops_the_committed_words_it_re_reads_in_other_words() -> None:
    """A window resumed before the commit point re-reads the last committed words; those it says differently are
    recognised by lying over their audio, one for one (a run re-read "a certain flavor of romance" as "different
    flavor of Romans" and committed both)."""
    committed = [word("a", 4.0, 4.5), word("certain", 4.5, 5.0), word("flavor", 5.0, 5.4), word("of", 5.4, 5.6)]
    committed.append(word("romance", 5.6, 6.0))
    head = Utterance(0, 10 * SR, 6 * SR, 10 * SR, closed=True, anchor=int(4.5 * SR), resume=int(4.5 * SR))
    heard = [word("different", 4.5, 5.0), word("flavor", 5.0, 5.4), word("of", 5.4, 5.6), word("Romans", 5.6, 6.0)]
    heard += [word("into", 6.0, 6.3), word("her", 6.3, 6.5)]
    assert [w.text for w in new_words(heard, head, committed, GUARDS)] == ["into", "her"]


def test_a_resumed_window_keeps_what_it_hears_under_a_stretched_committed_word_and_genuine_repeats() -> None:
    """DTW may stretch the last committed word over speech no word was written for: the resumed window's words
    there are new, once the committed word itself is re-read; and a word said twice is kept the second time."""
    head = Utterance(0, 10 * SR, int(7.5 * SR), 10 * SR, closed=True, anchor=int(4.5 * SR), resume=int(4.5 * SR))
    committed = [word("day", 4.0, 4.5), word("and", 4.5, 7.5)]
    heard = [word("and", 4.5, 4.7), word("unluckily", 4.7, 5.5), word("fell", 5.5, 5.8), word("asleep", 5.8, 6.4)]
    assert [w.text for w in new_words(heard, head, committed, GUARDS)] == ["unluckily", "fell", "asleep"]
    head = Utterance(0, 10 * SR, 6 * SR, 10 * SR, closed=True, anchor=int(5.6 * SR), resume=int(5.6 * SR))
    heard = [word("her", 5.6, 6.0), word("her", 6.0, 6.3), word("conversation", 6.3, 7.0)]
    assert [w.text for w in new_words(heard, head, [word("her", 5.6, 6.0)], GUARDS)] == ["her", "conversation"]
