"""Word timestamps from the cross-attention of the alignment heads, aligned with dynamic time warping.

After openai/whisper ``timing.py``: run the decoder once over the window's text tokens, take the alignment heads'
cross-attention over the audio frames, normalise it, median-filter it, and find the monotonic token-to-frame path
with DTW; a word starts at the frame where its first token's path begins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from streamer.core.units import HOP_LENGTH, SAMPLES_PER_TOKEN
from streamer.engine.kvcache import CrossKV
from streamer.engine.runtime import WhisperRuntime
from streamer.engine.tokenizer import WhisperTokenizer

__all__ = ["AlignedWord", "AlignmentItem", "align_words", "dtw", "median_filter"]

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


def median_filter(x: npt.NDArray[np.float32], width: int) -> npt.NDArray[np.float32]:
    """Median over a sliding window of odd ``width`` along the last axis, reflect-padded.

    An odd-even transposition sorting network over the ``width`` shifted copies: ``width`` rounds of elementwise
    min/max, a few dozen vectorised operations instead of a sort per element.
    """
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    length = x.shape[-1]
    lanes = [padded[..., k : k + length] for k in range(width)]
    for step in range(width):
        for i in range(step % 2, width - 1, 2):
            lanes[i], lanes[i + 1] = np.minimum(lanes[i], lanes[i + 1]), np.maximum(lanes[i], lanes[i + 1])
    return np.asarray(lanes[pad], dtype=np.float32)


def dtw(cost: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Minimum-cost monotonic path through ``cost`` ``[N, M]``; returns (row indices, column indices).

    Row by row, each row in a handful of vectorised numpy operations (N steps, not N x M): within a row,
    ``acc[i, j] = cost[i, j] + min(best[j], acc[i, j - 1])`` with ``best = min(diagonal, up)`` unrolls to
    ``S[j] + min over k <= j of (best[k] - S[k - 1])``, ``S`` the row's running sum of costs -- a running minimum.
    Ties prefer the diagonal, then up, then left.
    """
    n, m = cost.shape
    trace = np.zeros((n + 1, m + 1), dtype=np.int8)  # 0 diagonal, 1 up (i-1), 2 left (j-1)
    previous = np.full(m + 1, np.inf)
    previous[0] = 0.0
    for i in range(1, n + 1):
        diagonal, up = previous[:-1], previous[1:]
        running = np.cumsum(cost[i - 1], dtype=np.float64)
        before = np.concatenate(([0.0], running[:-1]))
        current = np.empty(m + 1)
        current[0] = np.inf
        current[1:] = running + np.minimum.accumulate(np.minimum(diagonal, up) - before)
        left = current[:-1]
        take_diagonal = (diagonal <= up) & (diagonal <= left)
        trace[i, 1:] = np.where(take_diagonal, 0, np.where((up < diagonal) & (up <= left), 1, 2))
        previous = current
    i, j = n, m
    rows: list[int] = []
    cols: list[int] = []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            step = trace[i, j]
            if step == 0:
                i, j = i - 1, j - 1
            elif step == 1:
                i -= 1
            else:
                j -= 1
    path = np.array([rows[::-1], cols[::-1]])
    return path[0], path[1]


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
    # every window's normalised attention made on the decoder's device, then brought to the host at once (on a GPU,
    # one wait for the batch rather than one per window)
    normalized = []
    for slot, index in enumerate(rows):
        weights = torch.stack([qks[pair][slot, : len(sequences[slot])] for pair in alignment_heads])
        normalized.append(_normalized_attention(weights, items[index].num_samples))
    on_host = _to_host(normalized)
    for slot, index in enumerate(rows):
        item = items[index]
        probs = item.token_probs
        if probs is None:  # the probabilities of the text tokens under the model, as openai/whisper computes them
            begin = len(item.sot_sequence)
            logits = runtime.project(hidden[slot, begin : begin + len(item.text_tokens)])[:, : sp.eot]
            chosen = logits.softmax(dim=-1)[torch.arange(len(item.text_tokens)), torch.tensor(item.text_tokens)]
            probs = chosen.tolist()
        out[index] = _words_from_attention(tokenizer, item, np.asarray(probs, dtype=np.float64), on_host[slot])
    return out


def _normalized_attention(weights: torch.Tensor, num_samples: int) -> torch.Tensor:
    """The alignment heads' cross-attention ``[heads, tokens, 1500]`` of one window over its own frames, softmaxed
    and standardised along the tokens, in float32 as openai/whisper does (the decoder's may be half precision)."""
    with torch.inference_mode():
        num_frames = max(1, min(num_samples // HOP_LENGTH, weights.shape[-1] * 2))
        weights = weights[:, :, : num_frames // 2 or 1].float().softmax(dim=-1)
        std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
        return (weights - mean) / (std + 1e-10)


def _to_host(tensors: list[torch.Tensor]) -> list[npt.NDArray[np.float32]]:
    """``tensors`` as NumPy arrays, copied from their device in one transfer (on the CPU, one copy)."""
    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1) for t in tensors]).cpu().numpy()
    out = []
    start = 0
    for tensor in tensors:
        out.append(flat[start : start + tensor.numel()].reshape(tensor.shape))
        start += tensor.numel()
    return out


def _words_from_attention(
    tokenizer: WhisperTokenizer,
    item: AlignmentItem,
    token_probs: npt.NDArray[np.float64],
    normalized: npt.NDArray[np.float32],
) -> list[AlignedWord]:
    """DTW over one window's normalised alignment-head attention (:func:`_normalized_attention`)."""
    sp = tokenizer.special
    text_tokens = item.text_tokens
    begin = len(item.sot_sequence)
    filtered = median_filter(normalized, MEDIAN_FILTER_WIDTH)
    matrix = filtered.mean(axis=0)[begin:-1]
    text_indices, time_indices = dtw(-matrix.astype(np.float64))
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
