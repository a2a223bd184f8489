from __future__ import annotations

import itertools

import numpy as np

from streamer.engine.timing import AlignedWord, _merge_punctuation, dtw, median_filter


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


def test_median_filter_matches_a_direct_median() -> None:
    x = np.random.default_rng(1).random((2, 3, 20)).astype(np.float32)
    out = median_filter(x, 7)
    padded = np.pad(x, [(0, 0), (0, 0), (3, 3)], mode="reflect")
    expected = np.stack([np.median(padded[..., k : k + 7], axis=-1) for k in range(20)], axis=-1)
    assert np.allclose(out, expected)


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
