"""A session's prompt and keywords in the decoder prompt, the keyword trie, and (tiny.en) what keywords buy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from streamer.engine.keywords import KeywordTrie, glossary, prompt_tokens, session_prompt
from streamer.engine.types import DecodeOptions


def chars(text: str) -> list[int]:
    """A tokenizer with one token per character: token counts are character counts."""
    return [ord(c) for c in text]


def text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


def test_the_glossary_lists_the_keywords_in_one_sentence() -> None:
    assert glossary(("kubectl", " etcd ", "Istio")) == "Glossary: kubectl, etcd, Istio."
    assert glossary(()) == ""


def test_the_session_prompt_is_the_glossary_then_the_initial_prompt() -> None:
    options = DecodeOptions(initial_prompt=" A talk on clusters. ", keywords=("etcd",))
    assert session_prompt(options) == "Glossary: etcd. A talk on clusters."
    assert session_prompt(DecodeOptions(initial_prompt="Hi.")) == "Hi."
    assert session_prompt(DecodeOptions()) == ""


def test_without_a_session_prompt_the_prompt_is_the_newest_committed_text() -> None:
    options = DecodeOptions(max_prompt_tokens=5)
    assert text(prompt_tokens(chars, options, "one two three")) == "three"
    assert prompt_tokens(chars, options, "   ") == []
    assert prompt_tokens(chars, replace(options, max_prompt_tokens=0), "one") == []


def test_the_session_prompt_stays_and_the_oldest_committed_text_goes_first() -> None:
    options = DecodeOptions(initial_prompt="P.", max_prompt_tokens=10)
    assert text(prompt_tokens(chars, options, "abc")) == " P. abc"
    # 3 tokens of session prompt, then the newest 7 of the committed text (cut by token, as Whisper cuts)
    assert text(prompt_tokens(chars, options, "one two three")) == " P.o three"
    # a session prompt longer than the budget keeps its end, next to the transcript
    long = replace(options, initial_prompt="0123456789abc")
    assert text(prompt_tokens(chars, long, "one two")) == "3456789abc"


def test_the_trie_boosts_every_first_token_and_the_next_one_of_a_started_keyword() -> None:
    trie = KeywordTrie.of(chars, ("abc", "abd", "x"))
    space = ord(" ")
    assert trie.first == {space}  # each keyword is encoded as a word in running text: " abc"
    assert trie.next_tokens(chars("hello")) == {space}
    assert trie.next_tokens(chars("hello ")) == {space, ord("a"), ord("x")}
    assert trie.next_tokens(chars("hello a")) == {space, ord("b")}
    assert trie.next_tokens(chars("hello ab")) == {space, ord("c"), ord("d")}
    assert trie.next_tokens(chars(" abc")) == {space}  # a keyword spelled out is done
    assert KeywordTrie.of(chars, ()).next_tokens(chars("ab")) == set()


# -- tiny.en: keywords raise the recall of rare words ---------------------------------------------------------------

# the bench's first utterances holding names (Margaret, Helstone, Zarathustra, Sherburn, Puttel, Polly, Liddy)
SAMPLED = 8
# measured (streamer bench keywords, tiny.en, 2 CPU cores): of their 18 rare-word occurrences, 6 found without
# keywords, 17 with them (16 with the glossary alone): a gain of 11; 6 leaves room for five words to flip
RECALL_GAIN = 6


@pytest.mark.model
def test_keywords_raise_the_recall_of_rare_words_on_real_speech(tiny_engine: object, shared_data: Path) -> None:
    """Several LibriSpeech utterances with names and rare words tiny.en misspells, each decoded with and without its
    keywords (and distractors of other utterances): recall rises by a margin far above what a CPU kernel's
    rounding could flip (one word changing either way moves it by 1/said)."""
    from streamer.bench.keywords import UTTERANCES, keyword_lists, score
    from streamer.core.options import CoreOptions
    from streamer.engine.types import DecodeRequest
    from streamer.engine.whisper import WhisperEngine
    from streamer.offline.audiofile import load_audio
    from streamer.offline.normalize import normalize_english

    assert isinstance(tiny_engine, WhisperEngine)
    folder = shared_data / "librispeech"
    references = dict(
        line.split("\t")[:2] for line in (folder / "transcripts.tsv").read_text(encoding="utf-8").splitlines()[1:]
    )
    base = replace(CoreOptions().decode, word_timestamps=False)
    chosen = [i for i, (_, own) in enumerate(UTTERANCES) if any(w[0].isupper() for w in own)][:SAMPLED]
    lists = keyword_lists(UTTERANCES)
    totals = {"none": [0, 0], "keywords": [0, 0]}
    for index in chosen:
        name, _ = UTTERANCES[index]
        own, others = lists[index]
        audio = load_audio(folder / name).samples
        for label, keywords in (("none", ()), ("keywords", (*own, *others))):
            options = replace(base, keywords=keywords)
            hypothesis = tiny_engine.decode([DecodeRequest(audio=audio, options=options)])[0].text
            result = score(references[name], hypothesis, own, others, normalize_english)
            totals[label][0] += result.found
            totals[label][1] += result.said
    (plain, said), (boosted, _) = totals["none"], totals["keywords"]
    assert said >= 12
    assert boosted - plain >= RECALL_GAIN, (plain, boosted, said)
