from __future__ import annotations

import itertools

import numpy as np
import torch

from streamer.engine.timing import (
    AlignedWord,
    _alignment_matrix,
    _batched_costs,
    _merge_punctuation,
    dtw,
    dtw_paths,
    median_filter,
)


def _brute_force_cost(cost: np.ndarray) -> float:
    """Cheapest monotonic path by plain dynamic programming, for reference."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0
    for i, j in itertools.product(range(1, n + 1), range(1, m + 1)):
        acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
    return float(acc[n, m])


def test_dtw_finds_the_cheapest_monotonic_path() -> None:
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 7), (12, 40), (9, 9), (40, 1), (60, 700)]:
        cost = rng.random(shape)
        rows, cols = dtw(cost)
        assert rows[0] == 0 and cols[0] == 0
        assert rows[-1] == shape[0] - 1 and cols[-1] == shape[1] - 1
        assert np.all(np.diff(rows) >= 0) and np.all(np.diff(cols) >= 0)
        assert np.all(np.diff(rows) + np.diff(cols) >= 1)  # every step moves
        assert np.isclose(cost[rows, cols].sum(), _brute_force_cost(cost))


def test_dtw_follows_a_diagonal_of_cheap_cells() -> None:
    cost = np.ones((4, 8))
    for i in range(4):
        cost[i, 2 * i : 2 * i + 2] = 0
    rows, cols = dtw(cost)
    starts = [int(cols[list(rows).index(i)]) for i in range(4)]
    assert starts == [0, 2, 4, 6]


def _reference_dtw(cost: np.ndarray) -> tuple[list[int], list[int]]:
    """openai/whisper's dtw_cpu and backtrace, cell by cell, with ties to the diagonal, then up, then left."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    trace = -np.ones((n + 1, m + 1), dtype=np.int64)
    acc[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            if c0 <= c1 and c0 <= c2:
                c, t = c0, 0
            elif c1 < c0 and c1 <= c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            acc[i, j] = cost[i - 1, j - 1] + c
            trace[i, j] = t
    return _reference_backtrace(trace, n, m)


def _reference_backtrace(trace: np.ndarray, n: int, m: int) -> tuple[list[int], list[int]]:
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    rows, cols = [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return rows[::-1], cols[::-1]


def test_dtw_paths_are_the_cell_by_cell_recurrence() -> None:
    rng = np.random.default_rng(2)
    for shape in [(1, 1), (2, 9), (12, 40), (40, 3), (30, 300)]:
        for cost in (rng.random(shape), rng.integers(0, 3, shape).astype(np.float64)):  # the second full of ties
            rows, cols = dtw(cost)
            assert (list(rows), list(cols)) == _reference_dtw(cost)


def test_dtw_paths_of_a_batch_are_each_matrix_alone() -> None:
    # padding another matrix's shape around a small one must not change its path; tie-heavy integer costs exercise
    # the tie rule (diagonal, then up, then left) through the batched row steps and the row-at-a-time backtrace
    rng = np.random.default_rng(3)
    shapes = [(5, 17), (31, 120), (1, 4), (12, 12), (40, 2)]
    for maker in (lambda s: rng.random(s), lambda s: rng.integers(0, 3, s).astype(np.float64)):
        costs = [maker(shape) for shape in shapes]
        alone = [dtw(cost) for cost in costs]
        batched = dtw_paths(_batched_costs([torch.from_numpy(c) for c in costs]), shapes)
        for (rows, cols), path in zip(alone, batched, strict=True):
            assert np.array_equal(rows, path.rows) and np.array_equal(cols, path.cols)
        for cost, (rows, cols) in zip(costs, alone, strict=True):
            assert np.isclose(cost[rows, cols].sum(), _brute_force_cost(cost))


def test_median_filter_matches_a_direct_median() -> None:
    x = np.random.default_rng(1).random((2, 3, 20)).astype(np.float32)
    out = median_filter(torch.from_numpy(x), 7).numpy()
    padded = np.pad(x, [(0, 0), (0, 0), (3, 3)], mode="reflect")
    expected = np.stack([np.median(padded[..., k : k + 7], axis=-1) for k in range(20)], axis=-1)
    assert np.array_equal(out, expected)


def test_alignment_matrix_is_numpys_median_and_head_mean_bit_for_bit() -> None:
    # the matrix made on the decoder's device is the one openai/whisper makes with NumPy on the host, exactly: a
    # difference in the last bit could move a DTW tie
    x = np.random.default_rng(4).standard_normal((6, 25, 300)).astype(np.float32)
    padded = np.pad(x, [(0, 0), (0, 0), (3, 3)], mode="reflect")
    filtered = np.stack([np.median(padded[..., k : k + 7], axis=-1) for k in range(300)], axis=-1)
    expected = -filtered.mean(axis=0)[3:-1].astype(np.float64)
    assert np.array_equal(_alignment_matrix(torch.from_numpy(x), 3).numpy(), expected)


def test_punctuation_joins_its_word_with_the_word_timing() -> None:
    words = [
        AlignedWord(' "', (1,), 0, 10, 0.9),
        AlignedWord("Hello", (2,), 10, 20, 0.8),
        AlignedWord(",", (3,), 20, 21, 0.7),
        AlignedWord(" world", (4,), 30, 40, 0.6),
        AlignedWord(".", (5,), 40, 41, 0.5),
    ]
    merged = _merge_punctuation(words)
    assert [w.word for w in merged] == [' "Hello,', " world."]
    assert merged[0].tokens == (1, 2, 3)
    assert (merged[1].start, merged[1].end) == (30, 40)
