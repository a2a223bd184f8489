from __future__ import annotations

import pytest
import torch

from streamer.engine.kvcache import CrossKV, KVCache
from streamer.engine.whisper import WhisperEngine
from tests.conftest import load_clip


@pytest.mark.kernels
def test_incremental_decoding_matches_one_full_pass(tiny_engine: WhisperEngine) -> None:
    """The cache is correct: token-by-token logits equal the logits of one pass over the whole sequence."""
    from streamer.engine.features import log_mel_spectrogram

    rt = tiny_engine.runtime
    states = rt.encode(log_mel_spectrogram([load_clip("1089-134686-0001.flac")]))
    cross = rt.cross_kv(states)
    tokens = [tiny_engine.tokenizer.special.sot, tiny_engine.tokenizer.special.no_timestamps]
    tokens += tiny_engine.tokenizer.encode(" Stuff it into you")
    full, _ = rt.decode_step(torch.tensor([tokens]), rt.new_cache(1), cross)
    cache = rt.new_cache(1)
    steps = [rt.decode_step(torch.tensor([[t]]), cache, cross)[0][0, -1] for t in tokens]
    assert cache.length == len(tokens)
    assert torch.allclose(torch.stack(steps), full[0], atol=1e-3)


def test_truncate_and_reorder() -> None:
    cache = KVCache.allocate(
        layers=1, batch=2, heads=1, length=8, head_dim=2, dtype=torch.float32, device=torch.device("cpu")
    )
    keys = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    cache.write(0, keys, keys)
    cache.advance(3)
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.keys[0][0, :, :3], keys[1])
    cache.truncate(1)
    k, _ = cache.write(0, keys[:, :, :1] * 0, keys[:, :, :1] * 0)
    assert k.shape[2] == 2


def _garbage_cache(batch: int = 3, length: int = 8) -> KVCache:
    """A cache whose memory holds NaN, as recycled memory may."""
    cache = KVCache.allocate(
        layers=2,
        batch=batch,
        heads=2,
        length=length,
        scratch=4,
        head_dim=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    for tensor in [*cache.keys, *cache.values]:
        tensor.fill_(float("nan"))
    return cache


def test_positions_are_zeroed_before_use_so_slots_a_row_never_wrote_cannot_poison_attention() -> None:
    """Masked slots get attention weight 0, and 0 times a NaN left in recycled memory would still be NaN."""
    cache = _garbage_cache()
    cache.clear_to(5)  # what decode_ragged does before a step whose longest row ends at 5
    for tensor in [*cache.keys, *cache.values]:
        assert torch.count_nonzero(tensor[:, :, :5]) == 0
        assert tensor[:, :, 5:].isnan().all()  # the rest is never touched: its pages need not be resident
    keys = torch.ones(3, 2, 7, 4)
    seen, _ = cache.write(0, keys, keys)  # a block past the cleared positions: cleared first, then written
    assert torch.equal(seen, keys)
    assert all(torch.count_nonzero(t[:, :, :7]) == 0 for t in [*cache.keys[1:], *cache.values[1:]])


def test_a_narrowed_view_shares_which_positions_are_cleared() -> None:
    cache = _garbage_cache()
    view = cache.narrow(2)
    view.clear_to(6)
    view.keys[0][0, 0, 4] = 7.0  # written through the view after clearing
    cache.clear_to(6)  # clears row 2 only: the rows the view cleared keep what was written since
    assert cache.keys[0][0, 0, 4, 0] == 7.0
    assert torch.count_nonzero(cache.keys[0][2, :, :6]) == 0
    cache.swap_rows(0, 2)
    assert cache.keys[0][2, 0, 4, 0] == 7.0 and torch.count_nonzero(cache.keys[0][0, :, :6]) == 0


def _cross(batch: int, frames: int, lengths: list[int] | None = None) -> CrossKV:
    keys = torch.arange(batch * frames * 2, dtype=torch.float32).view(batch, frames, 1, 2).transpose(1, 2)
    return CrossKV([keys], [keys + 0.5], lengths)


def test_a_row_of_a_batch_of_different_spans_is_its_own_frames() -> None:
    cross = _cross(3, 5, [5, 2, 4])
    row = cross.row(1)
    assert row.keys[0].shape == (1, 1, 2, 2) and row.lengths is None
    assert torch.equal(row.keys[0], cross.keys[0][1:2, :, :2]) and row.mask() is None
    mask = cross.mask()
    assert mask is not None and mask.shape == (3, 1, 1, 5)
    assert mask.view(3, 5).sum(dim=1).tolist() == [5, 2, 4]
    assert _cross(2, 5).mask() is None and _cross(2, 5, [5, 5]).mask() is None


def test_rows_of_different_spans_join_as_a_view_over_the_longest_and_masked() -> None:
    cross = _cross(3, 5, [5, 2, 4])
    rows = [cross.row(i) for i in (1, 2)]
    joined = CrossKV.concat(rows)
    assert joined.lengths == [2, 4] and joined.keys[0].shape == (2, 1, 4, 2)
    assert joined.keys[0].data_ptr() == cross.keys[0][1].data_ptr()  # a view, no copy
    assert torch.equal(joined.keys[0][1], cross.keys[0][2, :, :4])
    apart = CrossKV.concat([_cross(1, 2), _cross(1, 4)])  # different storages: copied, the shorter padded
    assert apart.lengths == [2, 4] and apart.keys[0].shape == (2, 1, 4, 2)
    assert torch.equal(apart.keys[0][0, :, :2], _cross(1, 2).keys[0][0]) and not apart.keys[0][0, :, 2:].any()
    same = CrossKV.concat([cross.row(0), _cross(1, 5)])
    assert same.lengths is None


def test_narrowing_swapping_and_expanding_keep_each_rows_span() -> None:
    cross = _cross(3, 5, [5, 2, 4])
    assert cross.narrow(2).lengths == [5, 2]
    cross.swap_rows(0, 2)
    assert cross.lengths == [4, 2, 5] and torch.equal(cross.keys[0][0], _cross(3, 5).keys[0][2])
    assert cross.row(0).keys[0].shape[2] == 4
    assert _cross(1, 5, [3]).expand(3).lengths == [3, 3, 3]


def test_masked_padding_attends_as_the_row_alone() -> None:
    """A row's padding past its span, whatever it holds, changes nothing of what its queries read."""
    torch.manual_seed(0)
    keys, values = torch.randn(2, 1, 6, 4), torch.randn(2, 1, 6, 4)
    cross = CrossKV([keys], [values], [6, 3])
    query = torch.randn(2, 1, 2, 4)
    out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=cross.mask())
    alone = torch.nn.functional.scaled_dot_product_attention(query[1:], keys[1:, :, :3], values[1:, :, :3])
    assert torch.allclose(out[1:], alone, atol=1e-6)
