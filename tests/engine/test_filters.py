from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from streamer.engine.filters import NEG_INF, LogitFilters
from streamer.engine.models import prepare
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import DecodeOptions


@pytest.fixture(scope="module")
def filters() -> LogitFilters:
    files = prepare("tiny.en")
    tokenizer = WhisperTokenizer(files.tokenizer, files.vocab_size)
    return LogitFilters(tokenizer, files.suppress_tokens, files.suppress_begin_tokens, files.vocab_size)


def _whisper_forces_timestamps(logits: torch.Tensor, tb: int) -> torch.Tensor:
    """openai/whisper ApplyTimestampRules' last rule, as written there: on log-softmax values."""
    logprobs = F.log_softmax(logits, dim=-1)
    return logprobs[:, tb:].logsumexp(dim=-1) > logprobs[:, :tb].max(dim=-1).values


def test_the_timestamp_rule_decides_as_whispers_log_softmax_form(filters: LogitFilters) -> None:
    tb = filters.tok.special.timestamp_begin
    vocab = tb + 1501  # <|0.00|> .. <|30.00|>
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(64, vocab, generator=generator) * 3
    # half the rows get strong timestamps, so both outcomes occur
    logits[::2, tb : tb + 50] += torch.linspace(4, 12, 32).view(-1, 1)
    sequences = [[tb + 10, 220] for _ in range(64)]  # text after a closed pair: every rule but the last is quiet
    options = DecodeOptions()
    masked = logits.clone()  # what the rules before the last one leave
    masked[:, filters.suppress] = NEG_INF
    masked[:, filters.tok.special.no_timestamps] = NEG_INF
    masked[:, tb : tb + 11] = NEG_INF  # timestamps never decrease, and a segment has non-zero length
    expected = _whisper_forces_timestamps(masked, tb)
    assert 0 < int(expected.sum()) < 64
    filtered = logits.clone()
    filters.apply(filtered, sequences, options)
    forced = (filtered[:, : filters.tok.special.eot] == NEG_INF).all(dim=-1)
    assert torch.equal(forced, expected)


def test_a_row_that_begins_must_start_with_an_early_timestamp(filters: LogitFilters) -> None:
    tb = filters.tok.special.timestamp_begin
    logits = torch.zeros(1, tb + 1501)
    filters.apply(logits, [[]], DecodeOptions(max_initial_timestamp=1.0))
    allowed = (logits[0] > NEG_INF).nonzero().view(-1).tolist()
    assert allowed == list(range(tb, tb + 51))  # <|0.00|> .. <|1.00|>


def test_the_keyword_bonus_lifts_each_keyword_s_next_token_and_nothing_the_rules_ruled_out(
    filters: LogitFilters,
) -> None:
    tb = filters.tok.special.timestamp_begin
    vocab = tb + 1501
    keyword = filters.tok.encode(" Zarathustra")
    assert len(keyword) >= 3
    options = DecodeOptions(keywords=("Zarathustra",), keyword_bonus=3.0)
    text = filters.tok.encode(" He said")
    sequences = [
        [tb, *text],  # running text: the keyword may start
        [tb, *text, *keyword[:2]],  # the keyword is under way: its third token may follow
        [tb, *text, tb + 50],  # a segment's closing timestamp: the next must be a timestamp, whatever the bonus
    ]
    logits = torch.zeros(3, vocab)
    logits[:, :tb] = 10.0  # text far likelier than any timestamp
    plain = logits.clone()
    filters.apply(plain, [list(s) for s in sequences], replace(options, keywords=()))
    boosted = logits.clone()
    filters.apply(boosted, [list(s) for s in sequences], options)
    lifted = [((boosted[r] - plain[r]) == 3.0).nonzero().view(-1).tolist() for r in range(2)]
    assert lifted[0] == [keyword[0]]
    assert lifted[1] == sorted({keyword[0], keyword[2]})
    assert torch.equal(boosted[2], plain[2])  # -inf stays -inf
    assert boosted[2, keyword[0]] == NEG_INF


def test_the_whole_tensor_rules_filter_as_the_row_by_row_ones(filters: LogitFilters) -> None:
    """apply_rules (the GPU's path) against apply, position by position, over random sequences drawn to hit every
    rule: timestamps open, closed, at the start, never decreasing, forced; with and without timestamps, blank
    suppression, a late initial timestamp and keywords."""
    tb = filters.tok.special.timestamp_begin
    eot = filters.tok.special.eot
    vocab = tb + 1501
    random = torch.Generator().manual_seed(7)
    keyword = filters.tok.encode(" Zarathustra")
    variants = [
        DecodeOptions(),
        DecodeOptions(without_timestamps=True),
        DecodeOptions(suppress_blank=False, max_initial_timestamp=0.4),
        DecodeOptions(keywords=("Zarathustra",), keyword_bonus=3.0),
    ]
    positions = []
    for draw in range(60):
        options = variants[draw % len(variants)]
        tokens = torch.randint(0, 3, (12,), generator=random).tolist()  # 0 text, 1 timestamp, 2 keyword piece
        sequence: list[int] = []
        stamp = tb
        for kind in tokens:
            if kind == 1:
                stamp += int(torch.randint(0, 30, (1,), generator=random))
                sequence.append(min(stamp, vocab - 1))
            elif kind == 2:
                sequence.extend(keyword[:2])
            else:
                sequence.append(int(torch.randint(0, eot, (1,), generator=random)))
        cut = int(torch.randint(0, len(sequence) + 1, (1,), generator=random))
        fed = [sequence[cut - 1] if cut else 50257, *sequence[cut:]]
        positions.append((sequence[:cut], fed, options))
    logits = torch.randn(sum(len(f) for _, f, _ in positions), vocab, generator=random) * 4
    logits[::3, tb : tb + 40] += 9  # timestamps strong enough to be forced in some rows
    expected = logits.clone()
    row = 0
    for sequence, fed, options in positions:
        for k in range(len(fed)):
            filters.apply(expected[row : row + 1], [sequence + fed[1 : k + 1]], options)
            row += 1
    got = logits.clone()
    filters.apply_rules(got, filters.rules(positions))
    assert torch.equal(got, expected)
    boosted = sum(1 for _, _, o in positions if o.keywords)
    assert boosted and bool((expected == NEG_INF).any(dim=-1).all())
    assert 0 < int((expected[:, :tb] == NEG_INF).all(dim=-1).sum()) < len(expected)  # text forced out in some rows
