"""Greedy decoding with draft verification in static shapes, for accelerators (issue 37).

The same decoding as :func:`streamer.engine.greedy.greedy_batch`, token for token (its module says how a draft is
verified); what differs is what the device sees and when the host waits for it:

- **Few shapes.** Every pass after the first feeds :data:`STEP_TOKENS` tokens per row (the last choice and up to
  ``SPECULATE`` draft tokens, padded) to a number of rows rounded up to a bucket (:data:`ROW_BUCKETS`), over a KV cache
  of the decoder's whole context attended under a mask (:meth:`WhisperRuntime.decode_static`). The first pass's width
  is rounded up to :data:`WIDTH_STEP`. A GPU then sees a handful of shapes for all windows: no attention kernel plans
  a new shape per step, and the step is one that a CUDA graph can replay.
- **One read per pass.** Every fed position a row may accept is projected, filtered
  (:meth:`LogitFilters.apply_rules`, whole-tensor operations) and chosen on the device; the host reads each pass's
  choices and their log-probabilities at once (:func:`_read`, the pass's only synchronisation), then walks them as the
  CPU path does (:func:`streamer.engine.greedy._walk`). What the host sends (tokens, positions, the filters' rules)
  goes ahead of the device's work without waiting for it.

On a CPU the lazy path is faster: it projects a row's positions a block at a time and stops at its first
disagreement, where this path projects every fed position. The engine takes this path for a decoder on a GPU
(``EngineOptions.static_shapes``); the tests hold it to the CPU path's tokens on real speech.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from streamer.engine.filters import LogitFilters, PositionRules
from streamer.engine.greedy import SPECULATE, GreedyOutcome, GreedyRow, _Compaction, _Row, _settle, _walk
from streamer.engine.kvcache import CrossKV
from streamer.engine.runtime import WhisperRuntime

__all__ = ["ROW_BUCKETS", "STEP_TOKENS", "WIDTH_STEP", "row_bucket", "static_greedy_batch"]

# tokens each row feeds per pass after the first: the last choice and up to SPECULATE draft tokens
STEP_TOKENS = SPECULATE + 1
# rows of a pass, rounded up to one of these (past the last, to a multiple of it)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# the first pass's width (prompt and draft) rounded up to a multiple of this
WIDTH_STEP = 32
# positions projected to the vocabulary and chosen at once: their float32 logits are this times 208 kB for the
# English models (1,024: 212 MB on the device)
CHOOSE_POSITIONS = 1024


def row_bucket(rows: int) -> int:
    """The batch a pass of ``rows`` rows runs in."""
    for bucket in ROW_BUCKETS:
        if rows <= bucket:
            return bucket
    last = ROW_BUCKETS[-1]
    return -(-rows // last) * last


def static_greedy_batch(
    rt: WhisperRuntime, filters: LogitFilters, eot: int, rows: Sequence[GreedyRow]
) -> list[GreedyOutcome]:
    """:func:`streamer.engine.greedy.greedy_batch` in static shapes with one host read per pass; results in row
    order."""
    if not rows:
        return []
    device = rt.decoder_device
    count = len(rows)
    drafts = [r.draft[: max(0, min(r.sample_len, rt.n_ctx - len(r.initial)) - 1)] for r in rows]
    limit = max(len(r.initial) + r.sample_len for r in rows)  # no row goes past it (greedy_batch's context)
    bucket = row_bucket(count)
    cache = rt.new_static_cache(bucket, scratch=STEP_TOKENS)
    # the bucket's spare rows read the first window's keys and values (their output is never read)
    cross = CrossKV.concat([r.cross for r in rows] + [rows[0].cross] * (bucket - count))
    states = [
        _Row(row, position=len(row.initial) - 1, pending=[row.initial[-1], *d], rest=list(d), passes=1)
        for row, d in zip(rows, drafts, strict=True)
    ]

    # pass 1: prompt and draft, every row from position 0
    inputs = [r.initial + d for r, d in zip(rows, drafts, strict=True)]
    width = min(rt.n_ctx, -(-max(len(seq) for seq in inputs) // WIDTH_STEP) * WIDTH_STEP)
    tokens = torch.full((bucket, width), eot, dtype=torch.long)
    lengths = torch.zeros(bucket, dtype=torch.long)
    for index, seq in enumerate(inputs):
        tokens[index, : len(seq)] = torch.tensor(seq)
        lengths[index] = len(seq)
    hidden = rt.decode_static(
        _upload(tokens, device), _upload(torch.zeros(bucket, dtype=torch.long), device), _upload(lengths, device),
        cache, cross,
    )  # fmt: skip
    # read: each row's <|startoftranscript|> (its no-speech probability), then its fed positions
    sot = [index * width + row.sot_index for index, row in enumerate(rows)]
    fed = [index * width + s.position + k for index, s in enumerate(states) for k in range(len(s.pending))]
    flat = hidden.reshape(-1, rt.d_model)[_upload(torch.tensor(sot + fed), device)]
    no_speech = rt.project(flat[:count]).softmax(-1)[:, filters.tok.special.no_speech]
    values = _read(rt, filters, flat[count:], _rules(filters, states), no_speech)
    _take(filters, eot, states, values[count:], limit)
    no_speech_probs = values[:count]

    compaction = _Compaction(list(range(count)), cross, cache)
    active = compaction.keep(states)
    while active:
        width = row_bucket(len(active))
        tokens = torch.full((width, STEP_TOKENS), eot, dtype=torch.long)
        starts = torch.zeros(width, dtype=torch.long)
        lengths = torch.zeros(width, dtype=torch.long)
        for slot, index in enumerate(active):
            state = states[index]
            tokens[slot, : len(state.pending)] = torch.tensor(state.pending)
            starts[slot] = state.position
            lengths[slot] = len(state.pending)
        hidden = rt.decode_static(
            _upload(tokens, device), _upload(starts, device), _upload(lengths, device),
            cache.narrow(width), cross.narrow(width),
        )  # fmt: skip
        stepped = [states[index] for index in active]
        at = [slot * STEP_TOKENS + k for slot, s in enumerate(stepped) for k in range(len(s.pending))]
        flat = hidden.reshape(-1, rt.d_model)[_upload(torch.tensor(at), device)]
        for state in stepped:
            state.passes += 1
        _take(filters, eot, stepped, _read(rt, filters, flat, _rules(filters, stepped)), limit)
        active = compaction.keep(states)
    compaction.restore()
    return [
        GreedyOutcome(
            tokens=[t for t in s.sequence if t != eot],
            sum_logprob=s.sum_logprob,
            no_speech_prob=ns,
            passes=s.passes,
            accepted=s.accepted,
            token_probs=[p for t, p in zip(s.sequence, s.probs, strict=True) if t != eot],
        )
        for s, ns in zip(states, no_speech_probs, strict=True)
    ]


def _rules(filters: LogitFilters, states: Sequence[_Row]) -> PositionRules:
    """The filters' rules for every fed position of ``states``, in order (on the host)."""
    return filters.rules([(s.sequence, s.pending, s.row.options) for s in states])


def _read(
    rt: WhisperRuntime,
    filters: LogitFilters,
    hidden: torch.Tensor,
    rules: PositionRules,
    first: torch.Tensor | None = None,
) -> list[float]:
    """The choice after each of ``hidden``'s positions and its log-probability, interleaved (``[c0, l0, c1, l1,
    ..]``), after ``first`` (values to read with them): projected, filtered and chosen :data:`CHOOSE_POSITIONS`
    at a time on the device, then read in one transfer, the pass's one host synchronisation."""
    device = hidden.device
    parts: list[torch.Tensor] = [] if first is None else [first.double()]
    for start in range(0, hidden.shape[0], CHOOSE_POSITIONS):
        block = hidden[start : start + CHOOSE_POSITIONS]
        logits = rt.project(block)
        filters.apply_rules(logits, rules.narrow(start, block.shape[0]).to(device))
        choices = logits.argmax(dim=-1)
        logprobs = logits.gather(1, choices.view(-1, 1)).view(-1) - logits.logsumexp(dim=-1)
        parts.append(torch.stack([choices.double(), logprobs.double()], dim=1).view(-1))
    values: list[float] = torch.cat(parts).cpu().tolist()
    return values


def _take(filters: LogitFilters, eot: int, states: Sequence[_Row], values: list[float], limit: int) -> None:
    """Walk each row's choices (``values`` as :func:`_read` returns them, the rows' fed positions in order) and set
    what it feeds next."""
    at = 0
    for state in states:
        width = len(state.pending)
        block = values[2 * at : 2 * (at + width)]
        state.checked = 0
        _walk(eot, state, [int(c) for c in block[0::2]], block[1::2])
        _settle(filters, state, limit)
        at += width


def _upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: to a GPU from pinned memory, without waiting for the copy (nor for the work
    queued before it)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
