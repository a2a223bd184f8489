"""Batched greedy decoding with draft verification: the fast path for streaming updates.

Each row is one window of one stream. A stream's previous hypothesis is fed as a *draft* together with the prompt
in one batched prefill pass; at every draft position the model's own greedy choice (after the logit filters) is
compared with the draft token, and the longest agreeing prefix is accepted with its KV entries. Decoding then goes
on autoregressively from the first disagreement, all rows of the batch stepping together, each at its own position
(continuous batching: rows leave as they finish). Because every accepted token is exactly the token plain greedy
decoding would have chosen from the same logits, the output is token-for-token that of plain greedy decoding,
while an update on steady speech costs one prefill pass plus one pass per *new* token instead of one per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from streamer.engine.filters import LogitFilters
from streamer.engine.kvcache import CrossKV
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.types import DecodeOptions

__all__ = ["GreedyOutcome", "GreedyRow", "greedy_batch"]


@dataclass(frozen=True)
class GreedyRow:
    """One window to decode greedily."""

    cross: CrossKV  # batch-1 cross-attention keys/values of the window
    initial: list[int]  # prompt + start-of-transcript tokens
    sot_index: int  # position of <|startoftranscript|> in ``initial`` (no-speech probability is read there)
    sample_len: int  # at most this many sampled tokens
    options: DecodeOptions
    draft: list[int]  # the stream's previous hypothesis (sampled tokens, no end-of-text); may be empty


@dataclass
class GreedyOutcome:
    tokens: list[int]  # sampled tokens without end-of-text
    sum_logprob: float
    no_speech_prob: float
    passes: int  # decoder forward passes this row took part in
    accepted: int  # draft tokens accepted
    token_probs: list[float] = field(default_factory=list)  # probability of each of ``tokens`` when chosen


@dataclass
class _Row:
    sequence: list[int]
    sum_logprob: float
    probs: list[float]
    position: int  # where the next token's keys/values go
    last: int  # the token to feed next
    done: bool
    passes: int
    accepted: int = 0  # draft tokens the model agreed with


def greedy_batch(rt: WhisperRuntime, filters: LogitFilters, eot: int, rows: list[GreedyRow]) -> list[GreedyOutcome]:
    """Decode every row greedily; results in row order."""
    if not rows:
        return []
    drafts = [r.draft[: max(0, min(r.sample_len, rt.n_ctx - len(r.initial)) - 1)] for r in rows]
    inputs = [r.initial + d for r, d in zip(rows, drafts, strict=True)]
    width = max(len(seq) for seq in inputs)
    batch = len(rows)
    cache = rt.new_cache(batch)
    cross = CrossKV.concat([r.cross for r in rows])
    padded = torch.tensor([seq + [eot] * (width - len(seq)) for seq in inputs])
    hidden, _ = rt.decode_hidden(padded, cache, cross)  # pass 1: prompt + draft, every row at once
    # project only what is read: <|startoftranscript|> (no-speech probability) and every sampled position
    wanted = [[row.sot_index, *range(len(row.initial) - 1, len(seq))] for row, seq in zip(rows, inputs, strict=True)]
    packed = rt.project(torch.cat([hidden[i, picks] for i, picks in enumerate(wanted)]))
    offsets = [0]
    for picks in wanted:
        offsets.append(offsets[-1] + len(picks))
    states: list[_Row] = []
    outcomes: list[GreedyOutcome] = []
    for index, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
        logits = packed[offsets[index] : offsets[index + 1]]
        no_speech = float(logits[0].softmax(-1)[filters.tok.special.no_speech])
        state = _verify(filters, eot, row, draft, logits[1:])
        states.append(state)
        outcomes.append(GreedyOutcome([], 0.0, no_speech, 1, state.accepted))
    active = [i for i, s in enumerate(states) if not s.done]
    if active and len(active) < batch:
        cache.reorder(torch.tensor(active))
        cross = cross.select(torch.tensor(active))
    while active:
        tokens = torch.tensor([states[i].last for i in active])
        positions = torch.tensor([states[i].position for i in active])
        step = rt.decode_rows(tokens, positions, cache, cross)
        _filter_rows(filters, step, [rows[i] for i in active], [states[i].sequence for i in active])
        logprobs = F.log_softmax(step, dim=-1)
        chosen = step.argmax(dim=-1).tolist()
        for slot, index in enumerate(active):
            state = states[index]
            state.passes += 1
            state.position += 1
            _take(state, int(chosen[slot]), float(logprobs[slot, chosen[slot]]), eot, rows[index], rt.n_ctx)
        still = [slot for slot, index in enumerate(active) if not states[index].done]
        if len(still) < len(active):
            keep = torch.tensor(still)
            if still:
                cache.reorder(keep)
                cross = cross.select(keep)
            active = [active[slot] for slot in still]
    for outcome, state in zip(outcomes, states, strict=True):
        outcome.tokens = [t for t in state.sequence if t != eot]
        outcome.token_probs = [p for t, p in zip(state.sequence, state.probs, strict=True) if t != eot]
        outcome.sum_logprob = state.sum_logprob
        outcome.passes += state.passes
    return outcomes


def _filter_rows(filters: LogitFilters, step: torch.Tensor, rows: list[GreedyRow], sequences: list[list[int]]) -> None:
    """Apply the logit filters to each group of rows that share decoding options."""
    groups: dict[DecodeOptions, list[int]] = {}
    for slot, row in enumerate(rows):
        groups.setdefault(row.options, []).append(slot)
    if len(groups) == 1:
        filters.apply(step, sequences, rows[0].options)
        return
    for options, slots in groups.items():
        index = torch.tensor(slots)
        part = step[index]
        filters.apply(part, [sequences[s] for s in slots], options)
        step[index] = part


def _take(state: _Row, token: int, logprob: float, eot: int, row: GreedyRow, n_ctx: int) -> None:
    """Append a chosen token, as plain greedy decoding does, and decide whether the row is finished."""
    state.sum_logprob += logprob
    state.sequence.append(token)
    state.probs.append(math.exp(logprob))
    state.last = token
    if token == eot or len(state.sequence) >= row.sample_len or state.position + 1 > n_ctx:
        state.done = True


def _verify(filters: LogitFilters, eot: int, row: GreedyRow, draft: list[int], logits: torch.Tensor) -> _Row:
    """Accept the longest draft prefix the model agrees with; ``logits[k]`` predicts sampled token ``k``."""
    state = _Row(sequence=[], sum_logprob=0.0, probs=[], position=len(row.initial), last=eot, done=False, passes=0)
    for k in range(len(draft) + 1):
        scores = logits[k : k + 1].clone()
        filters.apply(scores, [state.sequence], row.options)
        logprobs = F.log_softmax(scores[0], dim=-1)
        choice = int(scores[0].argmax())
        accepted = k < len(draft) and choice == draft[k]
        # the draft token's keys/values are already in the cache: an accepted token needs no pass of its own
        state.position = len(row.initial) + k
        _take(state, choice, float(logprobs[choice]), eot, row, 10**9)
        if state.done or not accepted:
            break
        state.accepted += 1
    if not state.done:
        # the last chosen token is fed next, at the position after the accepted prefix
        state.position = len(row.initial) + len(state.sequence) - 1
    return state
