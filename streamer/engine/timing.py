"""Word timestamps from the cross-attention of the alignment heads, aligned with dynamic time warping.

After openai/whisper ``timing.py``: run the decoder once over the window's text tokens, take the alignment heads'
cross-attention over the audio frames, normalise it, median-filter it, and find the monotonic token-to-frame path
with DTW; a word starts at the frame where its first token's path begins. All of it up to the DTW's choices runs on
the decoder's device for the whole batch of windows at once (on a GPU, no per-window work or wait on the host but the
backtrace, one step per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from streamer.core.units import HOP_LENGTH, SAMPLES_PER_TOKEN
from streamer.engine.kvcache import CrossKV
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.tokenizer import WhisperTokenizer

__all__ = ["AlignedWord", "AlignmentItem", "DtwPath", "align_words", "dtw", "dtw_paths", "median_filter"]

MEDIAN_FILTER_WIDTH = 7  # openai/whisper's medfilt_width
PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"


@dataclass(frozen=True)
class AlignedWord:
    """A word with its span in samples relative to the window start."""

    word: str
    tokens: tuple[int, ...]
    start: int
    end: int
    probability: float


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd ``width`` along the last axis, reflect-padded, on ``x``'s device.

    An odd-even transposition sorting network over the ``width`` shifted copies: ``width`` rounds of elementwise
    min/max, a few dozen vectorised operations instead of a sort per element (exact: only min and max).
    """
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])  # reflect padding pads the last axis of a 3-d tensor
    padded = torch.nn.functional.pad(flat, (pad, pad), mode="reflect").reshape(*shape[:-1], shape[-1] + 2 * pad)
    length = shape[-1]
    lanes = [padded[..., k : k + length] for k in range(width)]
    for step in range(width):
        for i in range(step % 2, width - 1, 2):
            lanes[i], lanes[i + 1] = torch.minimum(lanes[i], lanes[i + 1]), torch.maximum(lanes[i], lanes[i + 1])
    return lanes[pad]


@dataclass(frozen=True)
class DtwPath:
    """A monotonic path through a cost matrix, as openai/whisper's backtrace lists it: from ``(0, 0)`` to
    ``(N - 1, M - 1)``, one (row, column) pair per step."""

    rows: npt.NDArray[np.int64]
    cols: npt.NDArray[np.int64]


def dtw(cost: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Minimum-cost monotonic path through ``cost`` ``[N, M]``; returns (row indices, column indices). One matrix
    of :func:`dtw_paths`."""
    path = dtw_paths(torch.from_numpy(np.ascontiguousarray(cost, dtype=np.float64))[None], [cost.shape])[0]
    return path.rows, path.cols


def dtw_paths(costs: torch.Tensor, shapes: Sequence[tuple[int, int]]) -> list[DtwPath]:
    """The minimum-cost monotonic path of each matrix of a batch: ``costs`` ``[B, N, M]`` (float64, on any device)
    holds matrix ``b`` in its top-left ``shapes[b]`` corner (the rest is padding, any finite value).

    The accumulated costs run on ``costs``' device for the whole batch at once, row by row (N steps, not N x M):
    within a row, ``acc[i, j] = cost[i, j] + min(best[j], acc[i, j - 1])`` with ``best = min(diagonal, up)`` unrolls
    to ``S[j] + min over k <= j of (best[k] - S[k - 1])``, ``S`` the row's running sum of costs -- a running
    minimum. Ties prefer the diagonal, then up, then left. Padding to the right of or below a matrix never reaches
    it: a cell depends only on cells above and to its left. Each row's choices come to the host in one transfer
    with, per cell, the column where the path entering it there leaves its row (the last cell at or before it that
    does not step left), so the backtrace takes one step per row, not one per cell.
    """
    batch, n, m = costs.shape
    device = costs.device
    trace = torch.empty((batch, n + 1, m + 1), dtype=torch.int8, device=device)  # 0 diagonal, 1 up, 2 left
    trace[:, 0] = 2
    trace[:, :, 0] = 1
    previous = torch.full((batch, m + 1), float("inf"), dtype=torch.float64, device=device)
    previous[:, 0] = 0.0
    zero = torch.zeros((batch, 1), dtype=torch.float64, device=device)
    inf = torch.full((batch, 1), float("inf"), dtype=torch.float64, device=device)
    for i in range(1, n + 1):
        diagonal, up = previous[:, :-1], previous[:, 1:]
        running = torch.cumsum(costs[:, i - 1], dim=-1, dtype=torch.float64)
        before = torch.cat((zero, running[:, :-1]), dim=-1)
        current = torch.cat((inf, running + torch.cummin(torch.minimum(diagonal, up) - before, dim=-1).values), -1)
        left = current[:, :-1]
        take_diagonal = (diagonal <= up) & (diagonal <= left)
        take_up = (up < diagonal) & (up <= left)
        trace[:, i, 1:] = torch.where(take_diagonal, 0, torch.where(take_up, 1, 2)).to(torch.int8)
        previous = current
    columns = torch.arange(m + 1, device=device)
    # where a path entering a row at column j leaves it: the last column k <= j whose step is not left (column 0 steps
    # up), and whether it leaves up (else diagonally), as 2k + up: one int16 array to bring to the host
    leave = torch.cummax(torch.where(trace != 2, columns, 0), dim=-1).values
    up = torch.gather(trace, -1, leave) == 1
    exits = (leave * 2 + up).to(torch.int16).cpu().numpy()
    return [_backtrace(exits[b], *shapes[b]) for b in range(batch)]


def _backtrace(exits: npt.NDArray[np.int16], n: int, m: int) -> DtwPath:
    """openai/whisper's backtrace from ``(n, m)`` (each cell ``(i, j)`` recorded as ``(i - 1, j - 1)``), a row at a
    time: the steps left along row ``i`` from ``j`` to where it leaves (``exits``: see :func:`dtw_paths`), then the
    step up or diagonally; along the top row, left to the corner."""
    rows: list[npt.NDArray[np.int64]] = []
    cols: list[npt.NDArray[np.int64]] = []
    i, j = n, m
    while i > 0:
        code = int(exits[i, j])
        k = code >> 1
        span = np.arange(j - 1, k - 2, -1, dtype=np.int64)  # columns j .. k, recorded as j - 1 .. k - 1
        rows.append(np.full(len(span), i - 1, dtype=np.int64))
        cols.append(span)
        i, j = i - 1, (k if code & 1 else k - 1)
    if j > 0:
        rows.append(np.full(j, -1, dtype=np.int64))
        cols.append(np.arange(j - 1, -1, -1, dtype=np.int64))
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return DtwPath(empty, empty)
    return DtwPath(np.concatenate(rows)[::-1].copy(), np.concatenate(cols)[::-1].copy())


def _merge_punctuation(words: list[AlignedWord]) -> list[AlignedWord]:
    """openai/whisper ``merge_punctuations``: a leading mark joins the next word, a trailing mark the previous one."""
    text = [w.word for w in words]
    toks = [list(w.tokens) for w in words]
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        if text[i].startswith(" ") and text[i].strip() in PREPEND_PUNCTUATION:
            text[j], toks[j] = text[i] + text[j], toks[i] + toks[j]
            text[i], toks[i] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        if not text[i].endswith(" ") and text[j] in APPEND_PUNCTUATION:
            text[i], toks[i] = text[i] + text[j], toks[i] + toks[j]
            text[j], toks[j] = "", []
        else:
            i = j
        j += 1
    return [
        AlignedWord(t, tuple(k), w.start, w.end, w.probability) for t, k, w in zip(text, toks, words, strict=True) if t
    ]


@dataclass(frozen=True)
class AlignmentItem:
    """One window whose decoded text is to be aligned to its audio."""

    cross: CrossKV  # batch-1 cross-attention keys/values of the window
    sot_sequence: list[int]
    text_tokens: list[int]
    num_samples: int  # audio samples in the window
    language: str
    # each text token's probability from decoding; None has the alignment pass compute them (a costlier pass)
    token_probs: list[float] | None = None


def align_words(
    runtime: WhisperRuntime,
    tokenizer: WhisperTokenizer,
    alignment_heads: tuple[tuple[int, int], ...],
    items: list[AlignmentItem],
) -> list[list[AlignedWord]]:
    """Words of each item's ``text_tokens`` with sample spans inside its window; one batched decoder pass for all."""
    sp = tokenizer.special
    rows = [i for i, item in enumerate(items) if item.text_tokens]
    out: list[list[AlignedWord]] = [[] for _ in items]
    if not rows:
        return out
    sequences = [[*items[i].sot_sequence, sp.no_timestamps, *items[i].text_tokens, sp.eot] for i in rows]
    width = max(len(seq) for seq in sequences)
    padded = torch.tensor([seq + [sp.eot] * (width - len(seq)) for seq in sequences])
    cross = CrossKV.concat([items[i].cross for i in rows])
    with torch.inference_mode():
        hidden, qks = runtime.decode_hidden(
            padded, runtime.new_cache(len(rows), context=width), cross, qk_heads=alignment_heads
        )
    # every window's alignment matrix and its DTW made on the decoder's device for the whole batch; only the paths'
    # choices come to the host, in one transfer (on a GPU, one wait for the batch rather than one per window)
    matrices = []
    for slot, index in enumerate(rows):
        weights = torch.stack([qks[pair][slot, : len(sequences[slot])] for pair in alignment_heads])
        normalized = _normalized_attention(weights, items[index].num_samples)
        matrices.append(_alignment_matrix(normalized, len(items[index].sot_sequence)))
    paths = dtw_paths(_batched_costs(matrices), [(m.shape[0], m.shape[1]) for m in matrices])
    for slot, index in enumerate(rows):
        item = items[index]
        probs = item.token_probs
        if probs is None:  # the probabilities of the text tokens under the model, as openai/whisper computes them
            begin = len(item.sot_sequence)
            logits = runtime.project(hidden[slot, begin : begin + len(item.text_tokens)])[:, : sp.eot]
            chosen = logits.softmax(dim=-1)[torch.arange(len(item.text_tokens)), torch.tensor(item.text_tokens)]
            probs = chosen.tolist()
        out[index] = _words_from_path(tokenizer, item, np.asarray(probs, dtype=np.float64), paths[slot])
    return out


def _normalized_attention(weights: torch.Tensor, num_samples: int) -> torch.Tensor:
    """The alignment heads' cross-attention ``[heads, tokens, 1500]`` of one window over its own frames, softmaxed
    and standardised along the tokens, in float32 as openai/whisper does (the decoder's may be half precision)."""
    with torch.inference_mode():
        num_frames = max(1, min(num_samples // HOP_LENGTH, weights.shape[-1] * 2))
        weights = weights[:, :, : num_frames // 2 or 1].float().softmax(dim=-1)
        std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
        return (weights - mean) / (std + 1e-10)


def _alignment_matrix(normalized: torch.Tensor, begin: int) -> torch.Tensor:
    """The median-filtered attention averaged over the heads, over the text tokens (from ``begin``, the end of text
    left out): openai/whisper's DTW input, negated (a cost). The heads are summed one after another and divided, as
    NumPy's mean over the first axis does, so the matrix is the same wherever it is made."""
    filtered = median_filter(normalized, MEDIAN_FILTER_WIDTH)
    total = filtered[0].clone()
    for head in filtered[1:]:
        total += head
    return -(total / filtered.shape[0])[begin:-1].double()


def _batched_costs(matrices: list[torch.Tensor]) -> torch.Tensor:
    """The matrices in one ``[B, N, M]`` tensor, each in its top-left corner (zeros around it)."""
    rows = max(m.shape[0] for m in matrices)
    cols = max(m.shape[1] for m in matrices)
    costs = torch.zeros((len(matrices), rows, cols), dtype=torch.float64, device=matrices[0].device)
    for slot, matrix in enumerate(matrices):
        costs[slot, : matrix.shape[0], : matrix.shape[1]] = matrix
    return costs


def _words_from_path(
    tokenizer: WhisperTokenizer,
    item: AlignmentItem,
    token_probs: npt.NDArray[np.float64],
    path: DtwPath,
) -> list[AlignedWord]:
    """The words of one window from the DTW path through its alignment matrix (:func:`_alignment_matrix`)."""
    sp = tokenizer.special
    text_tokens = item.text_tokens
    text_indices, time_indices = path.rows, path.cols
    words, word_tokens = tokenizer.split_to_word_tokens([*text_tokens, sp.eot], item.language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] * SAMPLES_PER_TOKEN
    starts = jump_times[boundaries[:-1]]
    ends = jump_times[boundaries[1:]]
    aligned = [
        AlignedWord(
            word=word,
            tokens=tuple(toks),
            start=int(start),
            end=int(end),
            probability=float(np.mean(token_probs[i:j])),
        )
        for word, toks, start, end, i, j in zip(
            words[:-1], word_tokens[:-1], starts, ends, boundaries[:-1], boundaries[1:], strict=True
        )
    ]
    return _clamp_long_words(_merge_punctuation(aligned), item.num_samples)


def _clamp_long_words(words: list[AlignedWord], num_samples: int) -> list[AlignedWord]:
    """openai/whisper's heuristic: a word far longer than the median (often at a pause) is cut to twice it."""
    durations = np.array([w.end - w.start for w in words if w.end > w.start])
    if len(durations) == 0:
        return words
    median = float(np.median(durations))
    max_duration = min(0.7 * 16000, median * 2) if median > 0 else 0.7 * 16000
    out: list[AlignedWord] = []
    for index, word in enumerate(words):
        start, end = word.start, min(word.end, num_samples)
        if end - start > max_duration:
            sentence_end = word.word.strip()[-1:] in ".。!！?？"
            if index == 0 or sentence_end:
                start = max(start, int(end - max_duration)) if index == 0 else start
                end = min(end, int(start + max_duration)) if sentence_end else end
        out.append(AlignedWord(word.word, word.tokens, start, max(start, end), word.probability))
    return out
