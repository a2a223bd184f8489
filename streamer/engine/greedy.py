"""Batched greedy decoding with draft verification: the fast path for streaming updates.

Each row is one window of one stream. A stream's previous hypothesis is its *draft*. The first pass feeds the
prompt and the whole draft; at every draft position the model's own greedy choice (after the logit filters) is
compared with the draft token, and the longest agreeing prefix is accepted with its KV entries. At the first
disagreement the draft is re-aligned to the model's choice (a changed timestamp or word is skipped, a word the model
dropped is searched for a few tokens ahead) and the next pass feeds the chosen token *together with* the rest of the
draft, verifying it in the same pass. Rows step together, each at its own position and with its own number of
tokens (continuous batching: rows leave as they finish).

Every accepted token is exactly the token plain greedy decoding chooses from the same logits, so the output is
token-for-token that of plain greedy decoding, while an update on steady speech costs a pass per *disagreement and
new word* instead of one per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from streamer.engine.filters import LogitFilters
from streamer.engine.kvcache import CrossKV, KVCache
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.stopping import is_looping
from streamer.engine.types import DecodeOptions

__all__ = ["GreedyOutcome", "GreedyRow", "greedy_batch"]

# tokens of draft fed after a chosen token in one pass: enough for a clause, few enough that a wrong guess is cheap
SPECULATE = 24
# how far ahead in the draft a chosen token is looked for (the model dropped a word of its previous hypothesis)
LOOKAHEAD = 6
# positions projected to the vocabulary at once (each costs 200 KB of float32 logits): replaying 232 recorded
# streaming windows in batches of 3, 48 lowered the batch's worst peak by 15 MB against 96 (with the fixed mmap
# threshold of engine/memory.py), in the same time within the noise
PROJECT_ROWS = 48
# positions filtered and normalised at once while a draft is verified (each temporary: 200 KB per position)
VERIFY_ROWS = 16


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
    row: GreedyRow
    sequence: list[int] = field(default_factory=list)  # sampled so far
    text: list[int] = field(default_factory=list)  # the text tokens of ``sequence`` (for the loop check)
    probs: list[float] = field(default_factory=list)
    sum_logprob: float = 0.0
    position: int = 0  # where the first pending token's keys/values go
    pending: list[int] = field(default_factory=list)  # fed next: the last choice, then speculated draft tokens
    rest: list[int] = field(default_factory=list)  # draft tokens not yet matched
    done: bool = False
    passes: int = 0
    accepted: int = 0


def greedy_batch(rt: WhisperRuntime, filters: LogitFilters, eot: int, rows: list[GreedyRow]) -> list[GreedyOutcome]:
    """Decode every row greedily; results in row order."""
    if not rows:
        return []
    drafts = [r.draft[: max(0, min(r.sample_len, rt.n_ctx - len(r.initial)) - 1)] for r in rows]
    inputs = [r.initial + d for r, d in zip(rows, drafts, strict=True)]
    width = max(len(seq) for seq in inputs)
    context = max(len(r.initial) + r.sample_len for r in rows)  # no row goes past it
    cache = rt.new_cache(len(rows), scratch=SPECULATE + 1, context=context)
    cross = CrossKV.concat([r.cross for r in rows])
    padded = torch.tensor([seq + [eot] * (width - len(seq)) for seq in inputs])
    hidden, _ = rt.decode_hidden(padded, cache, cross)  # pass 1: prompt + draft, every row at once
    # project only what is read: <|startoftranscript|> (no-speech probability) and every sampled position
    wanted = [[row.sot_index, *range(len(row.initial) - 1, len(seq))] for row, seq in zip(rows, inputs, strict=True)]
    states = [
        _Row(row, position=len(row.initial) - 1, pending=[row.initial[-1], *d])
        for row, d in zip(rows, drafts, strict=True)
    ]
    no_speech = [0.0] * len(rows)
    for index, row_logits in _projected(rt, [hidden[i, w] for i, w in enumerate(wanted)]):
        state = states[index]
        no_speech[index] = float(row_logits[0].softmax(-1)[filters.tok.special.no_speech])
        state.rest = list(state.pending[1:])
        state.passes = 1
        _verify(filters, eot, state, row_logits[1:], cache.context)
    # rows that finish leave the batch: the unfinished ones are swapped into the first slots in place (no copy of
    # the batch's cross-attention keys/values, which can be 150 MB) and the passes run on that prefix
    compaction = _Compaction(list(range(len(rows))), cross, cache)
    active = compaction.keep(states)
    while active:
        width = len(active)
        pending = [states[i].pending for i in active]
        hidden = rt.decode_ragged(
            pending, [states[i].position for i in active], cache.narrow(width), cross.narrow(width)
        )
        for slot, row_logits in _projected(rt, [hidden[slot, : len(p)] for slot, p in enumerate(pending)]):
            state = states[active[slot]]
            state.passes += 1
            _verify(filters, eot, state, row_logits, cache.context)
        active = compaction.keep(states)
    compaction.restore()  # the caller's rows back in their order
    return [
        GreedyOutcome(
            tokens=[t for t in s.sequence if t != eot],
            sum_logprob=s.sum_logprob,
            no_speech_prob=ns,
            passes=s.passes,
            accepted=s.accepted,
            token_probs=[p for t, p in zip(s.sequence, s.probs, strict=True) if t != eot],
        )
        for s, ns in zip(states, no_speech, strict=True)
    ]


@dataclass
class _Compaction:
    """Which row sits in which batch slot while finished rows are moved out of the first slots."""

    order: list[int]  # order[slot] = the row in that slot
    cross: CrossKV
    cache: KVCache
    swaps: list[tuple[int, int]] = field(default_factory=list)

    def keep(self, states: list[_Row]) -> list[int]:
        """Move the unfinished rows among the current ones into the first slots; returns them, in slot order."""
        live = sum(1 for slot in range(len(self.order)) if not states[self.order[slot]].done)
        low, high = 0, len(self.order) - 1
        while True:
            while low < high and not states[self.order[low]].done:
                low += 1
            while high > low and states[self.order[high]].done:
                high -= 1
            if low >= high:
                break
            self._swap(low, high)
        del self.order[live:]
        return list(self.order)

    def _swap(self, a: int, b: int) -> None:
        self.cross.swap_rows(a, b)
        self.cache.swap_rows(a, b)
        self.order[a], self.order[b] = self.order[b], self.order[a]
        self.swaps.append((a, b))

    def restore(self) -> None:
        for a, b in reversed(self.swaps):
            self.cross.swap_rows(a, b)
        self.swaps.clear()


def _groups(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` in groups whose sizes add up to at most ``limit`` (one item at least)."""
    groups: list[list[int]] = []
    total = limit
    for index, size in enumerate(sizes):
        if total + size > limit:
            groups.append([])
            total = 0
        groups[-1].append(index)
        total += size
    return groups


def _projected(rt: WhisperRuntime, hidden: list[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(r, logits of hidden[r])`` for every row ``r``, projected to the vocabulary a few rows at a time (at most
    :data:`PROJECT_ROWS` positions, or one row): one product for several rows, with bounded memory."""
    for group in _groups([len(h) for h in hidden], PROJECT_ROWS):
        packed = rt.project(torch.cat([hidden[r] for r in group]))
        start = 0
        for r in group:
            yield r, packed[start : start + len(hidden[r])]
            start += len(hidden[r])


def _verify(filters: LogitFilters, eot: int, state: _Row, logits: torch.Tensor, n_ctx: int) -> None:
    """Choose after each fed token while the choices agree with the speculated ones; then line the draft up with the
    last choice and set what to feed next. ``logits[k]`` follows ``state.pending[: k + 1]``; they are filtered in
    place, :data:`VERIFY_ROWS` positions at a time and only up to the first disagreement (what follows it is never
    read), so a long rejected draft costs neither filtering nor vocabulary-sized temporaries."""
    row = state.row
    fed = state.pending
    used = 0
    while used < len(fed):
        start, stop = used, min(len(fed), used + VERIFY_ROWS)
        # each position filtered with the sequence it has if the fed tokens before it are accepted (they are, up to
        # the first disagreement, where the walk stops); state.sequence already holds those before ``start``
        sequences = [state.sequence + fed[start + 1 : k + 1] for k in range(start, stop)]
        scores = logits[start:stop]
        filters.apply(scores, sequences, row.options)
        choices = scores.argmax(dim=-1)
        chosen = scores.gather(1, choices.view(-1, 1)).view(-1) - scores.logsumexp(dim=-1)
        for k, (choice, logprob) in enumerate(zip(choices.tolist(), chosen.tolist(), strict=True), start):
            state.sum_logprob += logprob
            state.sequence.append(choice)
            state.probs.append(math.exp(logprob))
            used = k + 1
            if choice == eot or len(state.sequence) >= row.sample_len:
                state.done = True
                break
            if choice < eot:
                state.text.append(choice)
                if is_looping(state.text, row.options.stop_on_repeats):
                    state.done = True  # a loop: what follows would be cut anyway
                    break
            if k + 1 < len(fed) and choice == fed[k + 1]:
                state.accepted += 1  # the next fed token was right: its keys/values are already in the cache
                continue
            break
        else:
            continue  # the whole block agreed: verify the next one
        break
    # the fed tokens up to the last choice now sit in the cache; the draft lost what was confirmed
    state.position += used
    state.rest = state.rest[used - 1 :] if used - 1 <= len(state.rest) else []
    if state.done:
        return
    choice = state.sequence[-1]
    state.rest = _realign(state.rest, choice, filters.tok.special.timestamp_begin)
    room = min(SPECULATE, n_ctx - state.position - 1, row.sample_len - len(state.sequence))
    state.pending = [choice, *state.rest[: max(0, room)]]
    if state.position >= n_ctx:
        state.done = True


def _realign(rest: list[int], choice: int, timestamp_begin: int) -> list[int]:
    """The draft tokens to speculate after ``choice``, where ``rest[0]`` was the draft's guess for it."""
    if not rest:
        return []
    if rest[0] == choice:
        return rest[1:]
    ahead = rest[1 : 1 + LOOKAHEAD]
    if choice in ahead:  # the model left out a few of its previous tokens
        return rest[ahead.index(choice) + 2 :]
    return rest[1:]  # a changed word or timestamp: assume the rest still follows
