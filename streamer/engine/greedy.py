"""Batched greedy decoding with draft verification: the fast path for streaming updates.

Each row is one window of one stream. A stream's previous hypothesis is its *draft*. The first pass feeds the
prompt and the whole draft; at every draft position the model's own greedy choice (after the logit filters) is
compared with the draft token, and the longest agreeing prefix is accepted with its KV entries. At the first
disagreement the draft is re-aligned to the model's choice (a changed timestamp or word is skipped, a word the model
dropped is searched for a few tokens ahead, and a choice that takes up a skipped token again shows that the choices
before it were inserted, so the draft resumes after it) and the next pass feeds the chosen token *together with* the
rest of the draft, verifying it in the same pass. Rows step together, each at its own position and with its own
number of tokens (continuous batching: rows leave as they finish).

Every accepted token is exactly the token plain greedy decoding chooses from the same logits, so the output is
token-for-token that of plain greedy decoding, while an update on steady speech costs a pass per *disagreement and
new word* instead of one per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from streamer.engine.filters import LogitFilters
from streamer.engine.kvcache import CrossKV, KVCache
from streamer.engine.memory import MMAP_THRESHOLD
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.stopping import is_looping
from streamer.engine.types import DecodeOptions

__all__ = ["GreedyOutcome", "GreedyRow", "greedy_batch"]

# tokens of draft fed after a chosen token in one pass: enough for a clause, few enough that a wrong guess is cheap
SPECULATE = 24
# how far ahead in the draft a chosen token is looked for (the model dropped a word of its previous hypothesis)
LOOKAHEAD = 6
# positions filtered and normalised at once while a draft is verified, and projected to the vocabulary at once for a
# row: a row's positions are projected a block at a time and only up to its first disagreement, so a long rejected
# draft costs neither the projection nor vocabulary-sized temporaries past it
VERIFY_ROWS = 16
# positions of several rows' blocks projected in one product: as many as keep its float32 logits (and fbgemm's int32
# accumulator, as large) under the allocator's mmap threshold, so they reuse heap pages rather than being mapped and
# faulted in afresh on every call. Measured (throwaway probe, tiny.en, 2 cores): 192 positions projected 20 at a
# time took 17.8 ms, 48 at a time 41.0 ms; before this, a row projected its whole draft at once (a 150-token draft:
# 31 MB of logits and as much again inside fbgemm)
PROJECT_BYTES = MMAP_THRESHOLD


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
    # draft tokens skipped as changed since the draft last agreed with a choice (at most SPECULATE)
    lost: list[int] = field(default_factory=list)
    done: bool = False
    passes: int = 0
    accepted: int = 0
    checked: int = 0  # tokens of ``pending`` whose next choice this pass has made

    def outcome(self, eot: int, no_speech_prob: float) -> GreedyOutcome:
        return GreedyOutcome(
            tokens=[t for t in self.sequence if t != eot],
            sum_logprob=self.sum_logprob,
            no_speech_prob=no_speech_prob,
            passes=self.passes,
            accepted=self.accepted,
            token_probs=[p for t, p in zip(self.sequence, self.probs, strict=True) if t != eot],
        )


def greedy_batch(rt: WhisperRuntime, filters: LogitFilters, eot: int, rows: list[GreedyRow]) -> list[GreedyOutcome]:
    """Decode every row greedily; results in row order."""
    if not rows:
        return []
    states, context = _start(rt, rows)
    inputs = [s.row.initial + s.rest for s in states]
    width = max(len(seq) for seq in inputs)
    cache = rt.new_cache(len(rows), scratch=SPECULATE + 1, context=context)
    cross = CrossKV.concat([r.cross for r in rows])
    padded = torch.tensor([seq + [eot] * (width - len(seq)) for seq in inputs])
    hidden, _ = rt.decode_hidden(padded, cache, cross)  # pass 1: prompt + draft, every row at once
    # project only what is read: <|startoftranscript|> (the no-speech probability), then each row's fed tokens (its
    # last prompt token and its draft) as far as they are accepted
    sot = rt.project(hidden[torch.arange(len(rows)), torch.tensor([row.sot_index for row in rows])])
    no_speech = sot.softmax(-1)[:, filters.tok.special.no_speech].tolist()
    fed = [hidden[i, s.position : s.position + len(s.pending)] for i, s in enumerate(states)]
    _verify(rt, filters, eot, states, fed, cache.context)
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
        stepped = [states[i] for i in active]
        for state in stepped:
            state.passes += 1
        _verify(rt, filters, eot, stepped, [hidden[slot, : len(p)] for slot, p in enumerate(pending)], cache.context)
        active = compaction.keep(states)
    compaction.restore()  # the caller's rows back in their order
    return [s.outcome(eot, ns) for s, ns in zip(states, no_speech, strict=True)]


def _start(rt: WhisperRuntime, rows: Sequence[GreedyRow]) -> tuple[list[_Row], int]:
    """Each row's state before its first pass (feeding its last prompt token, then its draft, cut to what the
    context and the row's budget leave room for: ``rest``), and the context no row goes past."""
    states = []
    for row in rows:
        draft = row.draft[: max(0, min(row.sample_len, rt.n_ctx - len(row.initial)) - 1)]
        states.append(
            _Row(row, position=len(row.initial) - 1, pending=[row.initial[-1], *draft], rest=list(draft), passes=1)
        )
    return states, max(len(r.initial) + r.sample_len for r in rows)


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
    """``(r, logits of hidden[r])`` for every block ``r``, several blocks in one product while their float32 logits
    stay within :data:`PROJECT_BYTES` (a block is never split)."""
    limit = max(1, PROJECT_BYTES // (4 * rt.config.vocab_size))
    for group in _groups([len(h) for h in hidden], limit):
        packed = rt.project(torch.cat([hidden[r] for r in group]))
        start = 0
        for r in group:
            yield r, packed[start : start + len(hidden[r])]
            start += len(hidden[r])


def _verify(
    rt: WhisperRuntime, filters: LogitFilters, eot: int, states: list[_Row], hidden: list[torch.Tensor], n_ctx: int
) -> None:
    """Make each row's choices after its fed tokens (``hidden[r]``: the final hidden state of each of
    ``states[r].pending``) while they agree with the tokens fed after them; then line its draft up with its last
    choice and set what it feeds next. The positions are projected and filtered :data:`VERIFY_ROWS` at a time, and
    only up to a row's first disagreement: what follows it is never read."""
    for state in states:
        state.checked = 0
    open_rows = list(range(len(states)))
    while open_rows:
        blocks = [hidden[r][states[r].checked : states[r].checked + VERIFY_ROWS] for r in open_rows]
        still = []
        for slot, logits in _projected(rt, blocks):
            if _check(filters, eot, states[open_rows[slot]], logits):
                still.append(open_rows[slot])
        open_rows = still
    for state in states:
        _settle(filters, state, n_ctx)


def _check(filters: LogitFilters, eot: int, state: _Row, logits: torch.Tensor) -> bool:
    """Choose after each of the next ``len(logits)`` fed tokens (filtering ``logits`` in place) while the choices
    agree with the fed tokens; returns whether all agreed and fed tokens remain to be checked."""
    row = state.row
    fed = state.pending
    start = state.checked
    # each position filtered with the sequence it has if the fed tokens before it are accepted (they are, up to the
    # first disagreement, where the walk stops); state.sequence already holds those before ``start``
    sequences = [state.sequence + fed[start + 1 : k + 1] for k in range(start, start + len(logits))]
    filters.apply(logits, sequences, row.options)
    choices = logits.argmax(dim=-1)
    chosen = logits.gather(1, choices.view(-1, 1)).view(-1) - logits.logsumexp(dim=-1)
    return _walk(eot, state, choices.tolist(), chosen.tolist())


def _walk(eot: int, state: _Row, choices: list[int], logprobs: list[float]) -> bool:
    """Take the ``choices`` (with their log-probabilities) made after each fed token from ``state.checked`` on,
    while they agree with the fed tokens that follow; returns whether all agreed and fed tokens remain to be
    checked. What a row would have done had it chosen those tokens one pass at a time."""
    row = state.row
    fed = state.pending
    for k, (choice, logprob) in enumerate(zip(choices, logprobs, strict=True), state.checked):
        state.sum_logprob += logprob
        state.sequence.append(choice)
        state.probs.append(math.exp(logprob))
        state.checked = k + 1
        if choice == eot or len(state.sequence) >= row.sample_len:
            state.done = True
            return False
        if choice < eot:
            state.text.append(choice)
            if is_looping(state.text, row.options.stop_on_repeats):
                state.done = True  # a loop: what follows would be cut anyway
                return False
        if k + 1 < len(fed) and choice == fed[k + 1]:
            state.accepted += 1  # the next fed token was right: its keys/values are already in the cache
            continue
        return False
    return state.checked < len(fed)


def _settle(filters: LogitFilters, state: _Row, n_ctx: int) -> None:
    """After a pass's choices: the fed tokens up to the last choice now sit in the cache, the draft lost what was
    confirmed, and the next pass feeds the last choice with the draft's guess of what follows."""
    used = state.checked
    state.position += used
    state.rest = state.rest[used - 1 :] if used - 1 <= len(state.rest) else []
    if state.done:
        return
    choice = state.sequence[-1]
    realigned = _realign(state.rest, choice, state.lost)
    state.rest, state.lost = realigned.rest, realigned.lost
    room = min(SPECULATE, n_ctx - state.position - 1, state.row.sample_len - len(state.sequence))
    state.pending = [choice, *state.rest[: max(0, room)]]
    if state.position >= n_ctx:
        state.done = True


@dataclass(frozen=True)
class _Realigned:
    rest: list[int]  # the draft tokens to speculate after the choice
    lost: list[int]  # draft tokens skipped as changed since the draft last agreed with a choice


def _realign(rest: list[int], choice: int, lost: Sequence[int] = ()) -> _Realigned:
    """The draft after ``choice``, where ``rest[0]`` was the draft's guess for it and ``lost`` the draft tokens
    skipped as changed since the draft last agreed.

    A choice equal to the guess, or to a token a few ahead of it (the model left out some of its previous tokens),
    lines the draft up after it. A choice equal to a skipped token shows that the choices since it was skipped were
    inserted (a new word, a timestamp the draft did not have): the draft resumes after that token, with what follows
    it. Anything else is taken as a changed word or timestamp: its guess is skipped and the rest assumed to follow.
    Without that check one inserted token would put every later guess one token off, and each pass after it would
    accept one token while feeding a whole speculation (measured: 37 passes for a 40-token window whose draft
    lacked one word, 4 with it; tests/engine/test_greedy.py)."""
    if rest and rest[0] == choice:
        return _Realigned(rest[1:], [])
    ahead = rest[1 : 1 + LOOKAHEAD]
    if choice in ahead:  # the model left out a few of its previous tokens
        return _Realigned(rest[ahead.index(choice) + 2 :], [])
    if choice in lost:  # the choices since this token was skipped were inserted before it
        return _Realigned([*lost[lost.index(choice) + 1 :], *rest], [])
    if not rest:
        return _Realigned([], list(lost))
    return _Realigned(rest[1:], [*lost, rest[0]][:SPECULATE])  # a changed word or timestamp
