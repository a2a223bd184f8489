from __future__ import annotations

import pytest
import torch

from streamer.engine.kvcache import KVCache
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
