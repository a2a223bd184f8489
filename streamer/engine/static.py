"""Greedy decoding with draft verification in static shapes, for accelerators (issue 37).

The same decoding as :func:`streamer.engine.greedy.greedy_batch`, token for token (its module says how a draft is
verified); what differs is what the device sees and when the host waits for it:

- **Few shapes.** Every pass after the first feeds :data:`STEP_TOKENS` tokens per row (the last choice and up to
  ``SPECULATE`` draft tokens, padded) to a number of rows rounded up to a bucket (:data:`ROW_BUCKETS`), over a KV cache
  of the decoder's whole context attended under a mask (:meth:`WhisperRuntime.decode_static`). The first pass's width
  is rounded up to :data:`WIDTH_STEP`. A GPU then sees a handful of shapes for all windows: no attention kernel plans
  a new shape per step, and on CUDA each bucket's step is captured once as a CUDA graph and replayed
  (:class:`StaticBuffers`, which keeps the cache, the cross-attention keys and values and the step's inputs at fixed
  addresses from batch to batch).
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

import logging
from collections.abc import Sequence
from typing import Any

import torch

from streamer.engine.filters import LogitFilters, PositionRules
from streamer.engine.greedy import SPECULATE, GreedyOutcome, GreedyRow, _Compaction, _Row, _settle, _start, _walk
from streamer.engine.kvcache import CrossKV, KVCache
from streamer.engine.memory import upload
from streamer.engine.runtime import WhisperRuntime

__all__ = ["ROW_BUCKETS", "STEP_TOKENS", "WIDTH_STEP", "StaticBuffers", "row_bucket", "static_greedy_batch"]

log = logging.getLogger(__name__)

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


class StaticBuffers:
    """What the static path keeps from batch to batch on one engine: the KV cache and the cross-attention keys and
    values of the largest batch so far (zeroed once: every pass attends over all of the cache, masked, so nothing in
    it may be NaN; later batches leave finite values behind), the step's inputs, and on CUDA one captured graph of
    the step (:meth:`WhisperRuntime.decode_static` at :data:`STEP_TOKENS` tokens) per row bucket, replayed for every
    later pass of that many rows: one launch instead of a few hundred.

    A graph reads and writes fixed addresses, so every pass copies its inputs into the same buffers; a batch larger
    than the buffers reallocates them and drops the graphs. Capturing runs the step twice first (as CUDA asks), on
    the pass's own inputs: the step writes the same keys and values each time, so those runs change nothing. A
    capture that fails logs why once, and the step runs without graphs from then on."""

    def __init__(self, rt: WhisperRuntime, *, graphs: bool) -> None:
        self.rt = rt
        self.rows = 0
        self.graphs = graphs and rt.decoder_device.type == "cuda"
        self.captured: dict[int, tuple[Any, torch.Tensor]] = {}  # rows -> (graph, its output)
        self._pool: Any = None
        self.cache: KVCache | None = None
        self.cross: CrossKV | None = None
        self._inputs: torch.Tensor | None = None  # [rows, STEP_TOKENS + 2]: tokens, start, length

    def hold(self, rows: int, parts: Sequence[CrossKV]) -> tuple[KVCache, CrossKV]:
        """Room for ``rows`` rows, with the windows' cross keys and values (``parts``, in order) in the first rows."""
        if rows > self.rows:
            self._allocate(rows)
        assert self.cache is not None and self.cross is not None
        cross = self.cross.narrow(len(parts))
        joined = CrossKV.concat(list(parts))  # a view when the windows are consecutive rows of one batch
        for mine, theirs in zip((*cross.keys, *cross.values), (*joined.keys, *joined.values), strict=True):
            mine.copy_(theirs)
        return self.cache.narrow(rows), self.cross.narrow(rows)

    def _allocate(self, rows: int) -> None:
        rt = self.rt
        self.captured.clear()
        self.cache = self.cross = self._inputs = None  # the old buffers go before the new ones are made
        # scratch for a step's padding past the context, to a length the attention kernels take without padding the
        # mask themselves (a multiple of 32: 480 for Whisper's 448 positions)
        scratch = -(-(rt.n_ctx + STEP_TOKENS) // 32) * 32 - rt.n_ctx
        self.cache = rt.new_static_cache(rows, scratch=scratch)
        # the layout cross_kv gives ([rows, 1500, d_model] seen as heads), so attention reads them as it reads those
        shape = (rows, rt.n_audio_ctx, rt.n_heads, rt.head_dim)

        def heads() -> torch.Tensor:
            return torch.zeros(shape, dtype=rt.decoder_dtype, device=rt.decoder_device).transpose(1, 2)

        self.cross = CrossKV([heads() for _ in range(rt.n_layers)], [heads() for _ in range(rt.n_layers)])
        self._inputs = torch.zeros(rows, STEP_TOKENS + 2, dtype=torch.long, device=rt.decoder_device)
        self.rows = rows

    def step(self, inputs: torch.Tensor) -> torch.Tensor:
        """One pass of ``inputs`` (host ``[rows, STEP_TOKENS + 2]``: each row's tokens, then its start and length)
        over the first ``rows`` rows: hidden states ``[rows, STEP_TOKENS, d_model]``, valid until the next step."""
        rows = inputs.shape[0]
        assert self._inputs is not None and rows <= self.rows
        buffer = self._inputs[:rows]
        buffer.copy_(inputs.pin_memory() if buffer.is_cuda else inputs, non_blocking=True)
        if self.graphs:
            captured = self.captured.get(rows) or self._capture(rows)
            if captured is not None:
                captured[0].replay()
                return captured[1]
        return self._run(rows)

    def _run(self, rows: int) -> torch.Tensor:
        assert self._inputs is not None and self.cache is not None and self.cross is not None
        buffer = self._inputs[:rows]
        return self.rt.decode_static(
            buffer[:, :STEP_TOKENS], buffer[:, STEP_TOKENS], buffer[:, STEP_TOKENS + 1],
            self.cache.narrow(rows), self.cross.narrow(rows),
        )  # fmt: skip

    def _capture(self, rows: int) -> tuple[Any, torch.Tensor] | None:
        try:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(rows)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._run(rows)
        except RuntimeError as error:
            log.warning("the decoder step could not be captured as a CUDA graph (%s): running it without graphs", error)
            self.graphs = False
            self.captured.clear()
            return None
        self.captured[rows] = (graph, out)
        return graph, out


def static_greedy_batch(
    rt: WhisperRuntime,
    filters: LogitFilters,
    eot: int,
    rows: Sequence[GreedyRow],
    buffers: StaticBuffers | None = None,
) -> list[GreedyOutcome]:
    """:func:`streamer.engine.greedy.greedy_batch` in static shapes with one host read per pass; results in row
    order. ``buffers``: the engine's, kept between batches (else this batch's own, without graphs)."""
    if not rows:
        return []
    device = rt.decoder_device
    count = len(rows)
    buffers = buffers or StaticBuffers(rt, graphs=False)
    states, limit = _start(rt, rows)  # limit: no row goes past it (greedy_batch's context)
    bucket = row_bucket(count)
    cache, cross = buffers.hold(bucket, [r.cross for r in rows])  # the spare rows' output is never read

    # pass 1: prompt and draft, every row from position 0 (its width varies: not a graph)
    inputs = [s.row.initial + s.rest for s in states]
    width = min(rt.n_ctx, -(-max(len(seq) for seq in inputs) // WIDTH_STEP) * WIDTH_STEP)
    padded = [seq + [eot] * (width - len(seq)) for seq in inputs] + [[eot] * width] * (bucket - count)
    lengths = [len(seq) for seq in inputs] + [0] * (bucket - count)
    hidden = rt.decode_static(
        upload(torch.tensor(padded), device), upload(torch.zeros(bucket, dtype=torch.long), device),
        upload(torch.tensor(lengths), device), cache, cross,
    )  # fmt: skip
    # read: each row's <|startoftranscript|> (its no-speech probability), then its fed positions
    sot = [index * width + row.sot_index for index, row in enumerate(rows)]
    fed = [index * width + s.position + k for index, s in enumerate(states) for k in range(len(s.pending))]
    flat = hidden.reshape(-1, rt.d_model)[upload(torch.tensor(sot + fed), device)]
    no_speech = rt.project(flat[:count]).softmax(-1)[:, filters.tok.special.no_speech]
    values = _read(rt, filters, flat[count:], _rules(filters, states), no_speech)
    _take(filters, eot, states, values[count:], limit)
    no_speech_probs = values[:count]

    # the rows still going move to the first slots (their keys and values with them), and run in a bucket
    compaction = _Compaction(list(range(count)), cross, cache)
    active = compaction.keep(states)
    while active:
        stepped = [states[index] for index in active]
        width = row_bucket(len(active))
        step = [[*s.pending, *[eot] * (STEP_TOKENS - len(s.pending)), s.position, len(s.pending)] for s in stepped]
        step += [[eot] * STEP_TOKENS + [0, 0]] * (width - len(stepped))
        hidden = buffers.step(torch.tensor(step))
        at = [slot * STEP_TOKENS + k for slot, s in enumerate(stepped) for k in range(len(s.pending))]
        flat = hidden.reshape(-1, rt.d_model)[upload(torch.tensor(at), device)]
        for state in stepped:
            state.passes += 1
        _take(filters, eot, stepped, _read(rt, filters, flat, _rules(filters, stepped)), limit)
        active = compaction.keep(states)
    return [s.outcome(eot, ns) for s, ns in zip(states, no_speech_probs, strict=True)]


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
