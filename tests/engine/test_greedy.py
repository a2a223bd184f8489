"""Draft-verified greedy decoding gives exactly the tokens of plain greedy decoding, in fewer decoder passes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from streamer.core.units import SAMPLE_RATE
from streamer.engine import DecodeOptions, DecodeRequest, EngineOptions, StreamId, load_engine
from streamer.engine.greedy import PROJECT_BYTES, SPECULATE, VERIFY_ROWS, GreedyRow, _Row, _verify
from streamer.engine.whisper import WhisperEngine, shift_timestamps
from tests.conftest import load_clip

pytestmark = pytest.mark.model

STEP = SAMPLE_RATE  # one update per second of new audio, as the streaming core does by default
GREEDY = DecodeOptions(temperatures=(0.0,), word_timestamps=False)


@pytest.fixture(scope="module")
def plain() -> WhisperEngine:
    return load_engine("tiny.en", EngineOptions(draft_decoding=False, warmup=False))


def _updates(
    engine: WhisperEngine,
    stream: str,
    audio_name: str,
    trim_every: int = 0,
    options: DecodeOptions = GREEDY,
) -> list[tuple[int, ...]]:
    audio = load_clip(audio_name)
    tokens: list[tuple[int, ...]] = []
    start = 0
    for end in range(2 * STEP, len(audio) + 1, STEP):
        if trim_every and end - start > trim_every:
            start += trim_every // 2  # the core trims its buffer at committed text; timestamps then shift
        request = DecodeRequest(
            audio=audio[start:end], options=options, stream_id=StreamId(stream), stream_offset=start
        )
        tokens.append(engine.decode([request])[0].tokens)
    return tokens


@pytest.mark.kernels
def test_draft_decoding_is_token_for_token_plain_greedy(tiny_engine: WhisperEngine, plain: WhisperEngine) -> None:
    for trim in (0, 6 * STEP):
        assert _updates(tiny_engine, f"a{trim}", "1089-134686-0000.flac", trim) == _updates(
            plain, f"b{trim}", "1089-134686-0000.flac", trim
        )


@pytest.mark.kernels
def test_draft_decoding_with_a_session_prompt_and_keywords_is_token_for_token_plain_greedy(
    tiny_engine: WhisperEngine, plain: WhisperEngine
) -> None:
    """The keyword bonus is a logit filter like the others: verifying a draft applies it at every position exactly as
    plain greedy does, so the two still agree token for token (and the keywords do change the output)."""
    options = DecodeOptions(
        temperatures=(0.0,),
        word_timestamps=False,
        initial_prompt="A menu.",
        keywords=("flour-fattened", "Turnips", "ladle"),
        keyword_bonus=4.0,
    )
    name = "1089-134686-0000.flac"
    boosted = _updates(tiny_engine, "kw-a", name, options=options)
    assert boosted == _updates(plain, "kw-b", name, options=options)
    assert boosted != _updates(plain, "kw-c", name)


def test_draft_decoding_needs_fewer_passes(tiny_engine: WhisperEngine, plain: WhisperEngine) -> None:
    audio = load_clip("1089-134686-0000.flac")
    counts = {}
    for name, engine in (("draft", tiny_engine), ("plain", plain)):
        total = 0
        for end in range(2 * STEP, len(audio) + 1, STEP):
            request = DecodeRequest(
                audio=audio[:end],
                options=DecodeOptions(temperatures=(0.0,), word_timestamps=False),
                stream_id=StreamId(f"passes-{name}"),
            )
            total += engine.decode([request])[0].decoder_passes
        counts[name] = total
    assert counts["draft"] * 2 < counts["plain"]


@pytest.mark.kernels
def test_streams_batched_together_decode_as_they_do_alone(tiny_engine: WhisperEngine) -> None:
    a, b = load_clip("1089-134686-0000.flac"), load_clip("121-127105-0000.flac")
    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False)
    alone = [tiny_engine.decode([DecodeRequest(audio=x[: 5 * STEP], options=options)])[0].tokens for x in (a, b)]
    together = tiny_engine.decode(
        [DecodeRequest(audio=x[: 5 * STEP], options=options, request_id=i) for i, x in enumerate((a, b))]
    )
    assert [r.tokens for r in together] == alone


def test_a_draft_lacking_a_word_costs_a_pass_or_two_not_one_per_token(tiny_engine: WhisperEngine) -> None:
    """The model says a word its previous hypothesis lacked (an insertion): the rest of the draft is verified in
    the pass after, not one token a pass (the draft's guesses one token off) until the window's end."""
    from streamer.engine.whisper import _Draft

    request = DecodeRequest(audio=load_clip("1089-134686-0000.flac"), options=GREEDY, stream_id=StreamId("insert"))
    first = tiny_engine.decode([request])[0]
    agreeing = tiny_engine.decode([request])[0].decoder_passes  # the draft is this window's own tokens
    tokens = list(first.tokens)
    text = [i for i, t in enumerate(tokens) if t < tiny_engine.tokenizer.special.timestamp_begin]
    assert len(text) > 20
    cut = text[3]
    tiny_engine._drafts[StreamId("insert")] = _Draft(tokens[:cut] + tokens[cut + 1 :], 0)
    again = tiny_engine.decode([request])[0]
    assert again.tokens == first.tokens
    # the inserted word's pass, the pass that finds the draft again, then SPECULATE draft tokens a pass
    assert again.decoder_passes <= agreeing + 2 + len(tokens) // SPECULATE


def test_forgetting_a_stream_drops_its_draft(tiny_engine: WhisperEngine) -> None:
    audio = load_clip("1089-134686-0001.flac")
    request = DecodeRequest(audio=audio, options=DecodeOptions(temperatures=(0.0,)), stream_id=StreamId("f"))
    first = tiny_engine.decode([request])[0]
    again = tiny_engine.decode([request])[0]
    assert again.tokens == first.tokens and again.decoder_passes < first.decoder_passes
    tiny_engine.forget_stream(StreamId("f"))
    assert tiny_engine.decode([request])[0].decoder_passes == first.decoder_passes


def test_realign_skips_changed_and_dropped_draft_tokens() -> None:
    from streamer.engine.greedy import _realign

    tb = 1000
    assert _realign([5, 6, 7], 5).rest == [6, 7]  # agreed
    moved = _realign([tb + 10, 6, 7], tb + 12)  # a timestamp moved: the text after it follows
    assert (moved.rest, moved.lost) == ([6, 7], [tb + 10])
    assert _realign([5, 6, 7, 8], 7).rest == [8]  # the model dropped two of its previous tokens
    assert _realign([5, 6], 9).rest == [6]  # a changed word
    assert _realign([], 9).rest == []
    assert _realign([6, 7], 6, lost=[5]).lost == []  # the draft agrees again: nothing is skipped any more


def test_realign_resumes_the_draft_after_inserted_tokens() -> None:
    from streamer.engine.greedy import _realign

    # the draft was 5 6 7 8; the model says 9 5 6 7 8 (a word inserted): guessing 5 for 9 fails, and 5 is lost
    first = _realign([5, 6, 7, 8], 9)
    assert (first.rest, first.lost) == ([6, 7, 8], [5])
    # the next choice is the lost 5: the 9 was inserted, and 6 7 8 follow
    assert _realign(first.rest, 5, first.lost).rest == [6, 7, 8]
    # two inserted (9 10 5 6 7 8): the draft resumes after the first lost token it finds again
    second = _realign(first.rest, 10, first.lost)
    assert (second.rest, second.lost) == ([7, 8], [5, 6])
    assert _realign(second.rest, 5, second.lost).rest == [6, 7, 8]
    # an inserted token at the draft's end: the lost token comes back with nothing after it
    assert _realign([], 5, [5]).rest == []
    assert _realign([], 9, [5]).lost == [5]


def test_shift_timestamps_drops_segments_before_the_new_start() -> None:
    tb = 1000
    tokens = [tb + 0, 1, 2, tb + 50, tb + 50, 3, tb + 100, tb + 120, 4, tb + 140]
    assert shift_timestamps(tokens, 0, tb) == tokens
    assert shift_timestamps(tokens, 50, tb) == [tb + 0, 3, tb + 50, tb + 70, 4, tb + 90]
    assert shift_timestamps(tokens, 110, tb) == [tb + 10, 4, tb + 30]
    assert shift_timestamps(tokens, 200, tb) == []


# tiny.en continues this prompt with "I'm sorry," until the token limit on silence, natively and under every kernel
# variant of .ci/kernel-variants (checked); "I'm sorry. " * 6 became " You" under ATEN_CPU_CAPABILITY=default and
# with the INT8 encoder that an AVX2-only oneDNN selects
LOOPING_PROMPT = "I'm sorry, " * 5


def _silence_after_a_looping_prompt(engine: WhisperEngine, **options: object) -> tuple[int, str, int]:
    request = DecodeRequest(
        audio=np.zeros(5 * SAMPLE_RATE, dtype=np.float32),
        options=DecodeOptions(temperatures=(0.0,), word_timestamps=False, no_speech_threshold=None, **options),
        prompt=LOOPING_PROMPT,
    )
    result = engine.decode([request])[0]
    tokens = sum(len(s.tokens) for s in result.segments)
    return result.decoder_passes, result.text, tokens


def test_a_loop_stops_once_it_is_certain(tiny_engine: WhisperEngine) -> None:
    passes, text, _ = _silence_after_a_looping_prompt(tiny_engine)
    assert passes > 200 and text.count("sorry") > 10  # the model's own greedy choice: sorry, until the end
    passes, text, _ = _silence_after_a_looping_prompt(tiny_engine, stop_on_repeats=3)
    assert passes < 30 and text.count("sorry") == 3


def test_the_token_budget_follows_the_window_length(tiny_engine: WhisperEngine) -> None:
    _, _, tokens = _silence_after_a_looping_prompt(tiny_engine, max_tokens_per_second=1.0)
    assert tokens <= 16 + 5


class _CountingFilters:
    """LogitFilters that filter nothing and count the positions they were asked to filter."""

    def __init__(self, timestamp_begin: int) -> None:
        self.positions = 0
        self.tok = SimpleNamespace(special=SimpleNamespace(timestamp_begin=timestamp_begin))

    def apply(self, logits: torch.Tensor, sequences: list[list[int]], options: DecodeOptions) -> None:
        assert len(sequences) == len(logits)
        self.positions += len(sequences)


def _state(fed: list[int]) -> _Row:
    row = GreedyRow(cross=None, initial=[1], sot_index=0, sample_len=200, options=DecodeOptions(), draft=fed[1:])  # type: ignore[arg-type]
    return _Row(row, pending=list(fed), rest=list(fed[1:]))


def _logits_choosing(choices: list[int], vocab: int = 100) -> torch.Tensor:
    logits = torch.zeros(len(choices), vocab)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 10.0
    return logits


class _IdentityProjection:
    """A runtime whose "hidden states" are already logits; counts the positions it projects and its products."""

    def __init__(self, vocab: int = 100) -> None:
        self.config = SimpleNamespace(vocab_size=vocab)
        self.positions = 0
        self.products: list[int] = []

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        self.positions += len(hidden)
        self.products.append(len(hidden))
        return hidden.clone()


def test_a_draft_is_filtered_only_up_to_its_first_disagreement() -> None:
    fed = [5, *range(10, 50)]  # the last choice, then 40 speculated draft tokens
    filters = _CountingFilters(timestamp_begin=90)
    state = _state(fed)
    rt = _IdentityProjection()
    _verify(rt, filters, 99, [state], [_logits_choosing([11, *fed[2:], 60])], n_ctx=448)  # type: ignore[arg-type]
    assert state.sequence == [11] and state.accepted == 0
    assert filters.positions <= VERIFY_ROWS < len(fed)
    assert rt.positions <= VERIFY_ROWS  # nor projected past its first block


def test_an_agreeing_draft_is_accepted_across_verification_blocks() -> None:
    fed = [5, *range(10, 50)]
    filters = _CountingFilters(timestamp_begin=90)
    state = _state(fed)
    rt = _IdentityProjection()
    _verify(rt, filters, 99, [state], [_logits_choosing([*fed[1:], 60])], n_ctx=448)  # type: ignore[arg-type]
    assert state.sequence == [*fed[1:], 60] and state.accepted == 40
    assert filters.positions == len(fed) == rt.positions and state.pending == [60]
    assert state.position == len(fed)


def test_rows_are_projected_a_block_at_a_time_within_the_byte_budget() -> None:
    agreeing, disagreeing = [5, *range(10, 50)], [7, *range(50, 90)]
    rt = _IdentityProjection(vocab=51864)  # 20 positions of its float32 logits fit under the budget
    limit = PROJECT_BYTES // (4 * 51864)
    states = [_state(agreeing), _state(disagreeing), _state(agreeing)]
    hidden = [
        _logits_choosing([*agreeing[1:], 60]),
        _logits_choosing([50, 51, 11, *range(53, 91)]),  # the second choice after 51 disagrees
        _logits_choosing([*agreeing[1:], 60]),
    ]
    _verify(rt, _CountingFilters(timestamp_begin=95), 99, states, hidden, n_ctx=448)  # type: ignore[arg-type]
    assert [s.sequence for s in states] == [[*agreeing[1:], 60], [50, 51, 11], [*agreeing[1:], 60]]
    assert max(rt.products) <= limit
    assert rt.positions == 2 * len(agreeing) + VERIFY_ROWS  # the disagreeing row: its first block only
