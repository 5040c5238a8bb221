"""X-codec2 wrapper on the tiny random codec: batched decoding, lengths, encoding, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.codec.base import Codec, CodecError, length_batches
from engine.codec.xcodec2 import Xcodec2Codec

HOP = 320


@pytest.fixture(scope="module")
def codec(kit_dir) -> Xcodec2Codec:
    return Xcodec2Codec.load(kit_dir / "codec", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def spread_codec(kit_dir, tmp_path_factory) -> Xcodec2Codec:
    """The kit codec with its quantizer input rescaled so clips encode to varied codes."""
    from engine.kit.codec import write_spread_codec

    path = write_spread_codec(kit_dir / "codec", tmp_path_factory.mktemp("codec") / "spread")
    return Xcodec2Codec.load(path, device="cpu", dtype="float32")


def random_codes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 65536, n)


def test_implements_codec_interface(codec):
    assert isinstance(codec, Codec)
    assert (codec.sample_rate, codec.frame_codes, codec.frame_samples, codec.codebook_size) == (16000, 1, HOP, 65536)


def test_decode_matches_transformers_model(codec, kit_dir):
    """Loading only the decode path gives Xcodec2Model.decode's audio exactly."""
    from transformers import Xcodec2Model

    ref = Xcodec2Model.from_pretrained(str(kit_dir / "codec")).eval()
    codes = np.stack([random_codes(23, 0), random_codes(23, 1)])
    with torch.no_grad():
        want = ref.decode(torch.from_numpy(codes)[:, None]).audio_values[:, 0].numpy()  # [2, 23*320]
    got = codec.decode(list(codes))
    np.testing.assert_allclose(np.stack(got), want, rtol=0, atol=1e-6)


def test_decode_path_holds_no_encoder_weights(codec):
    names = list(codec.parts.state_dict())
    assert names and all(n.startswith(("quantizer.", "acoustic_decoder.")) for n in names)
    assert codec._encoder is None  # loaded only when something is encoded


def test_batched_equals_single_for_equal_lengths(codec):
    items = [random_codes(41, s) for s in range(4)]
    assert length_batches([41] * 4, codec.max_batch) == [[0, 1, 2, 3]]  # one batch of 4
    batched = codec.decode(items)
    for item, wav in zip(items, batched):
        single = codec.decode([item])[0]
        np.testing.assert_allclose(wav, single, rtol=0, atol=1e-6 * max(1.0, np.abs(single).max()))


@pytest.mark.parametrize("n", [1, 2, 50, 123])
def test_output_is_exactly_n_codes_times_hop(codec, n):
    (wav,) = codec.decode([random_codes(n, n)])
    assert wav.shape == (n * HOP,) and wav.dtype == np.float32 and np.isfinite(wav).all()


def test_mixed_lengths_come_back_in_input_order(codec):
    lengths = [5, 9, 5, 12, 9, 1]
    items = [random_codes(n, i) for i, n in enumerate(lengths)]
    out = codec.decode(items)
    assert [len(w) for w in out] == [n * HOP for n in lengths]
    for item, wav in zip(items, out):
        np.testing.assert_allclose(wav, codec.decode([item])[0], rtol=0, atol=1e-6)


def test_accepts_lists_arrays_and_tensors(codec):
    codes = random_codes(7, 3)
    a, b, c = codec.decode([codes.tolist(), codes.astype(np.int32), torch.from_numpy(codes)])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_length_batches_caps_items_and_codes():
    assert length_batches([3, 5, 3, 3, 5], max_batch=2) == [[1, 4], [0, 2], [3]]
    # 10 codes per batch at most: two items of 4, then the last; a 12-code item alone.
    assert length_batches([4, 4, 4, 12], max_batch=8, max_batch_codes=10) == [[3], [0, 1], [2]]
    with pytest.raises(ValueError, match="max_batch"):
        length_batches([1], max_batch=0)


def test_decode_iter_streams_in_input_order(codec):
    items = [random_codes(n, n) for n in (4, 6, 4, 8, 6)]
    pulled = []

    def source():
        for item in items:
            pulled.append(1)
            yield item

    stream = codec.decode_iter(source(), window=2)
    first = next(stream)
    assert len(pulled) == 2  # one window was read, not the whole job
    rest = list(stream)
    want = codec.decode(items)
    for got, ref in zip([first, *rest], want):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert len(rest) == len(items) - 1


@pytest.mark.parametrize("codes, match", [
    ([], "empty"),
    ([1, 65536, 2], "65536 at position 1"),
    ([-1], "-1 at position 0"),
    ([[1, 2]], "flat list"),
    ([0.5, 1.0], "integers"),
])
def test_bad_codes_raise_clear_errors(codec, codes, match):
    with pytest.raises(CodecError, match=match):
        codec.decode([list(range(5)), codes])


def test_bfloat16_decode_close_to_float32(kit_dir, codec):
    bf16 = Xcodec2Codec.load(kit_dir / "codec", device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert bf16.parts.acoustic_decoder.head.window.dtype == torch.float32  # ISTFT window kept exact
    codes = random_codes(30, 9)
    ref, got = codec.decode([codes])[0], bf16.decode([codes])[0]
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
    assert np.corrcoef(got, ref)[0, 1] > 0.98


def test_encode_gives_n_over_hop_plus_one_codes_in_range(spread_codec):
    rng = np.random.default_rng(0)
    t = np.arange(8000) / 16000
    clip = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(8000)).astype(np.float32)
    (codes,) = spread_codec.encode([clip])
    assert len(codes) == 8000 // HOP + 1
    assert all(isinstance(c, int) and 0 <= c < 65536 for c in codes)
    assert len(set(codes)) > 5  # the spread kit codec uses many codes, not one
    assert spread_codec.encode([clip]) == [codes]  # deterministic
    decoded = spread_codec.decode([codes])[0]
    assert decoded.shape == (len(codes) * HOP,)


@pytest.mark.parametrize("wave, match", [
    (np.zeros(0, np.float32), "non-empty mono"),
    (np.zeros((2, 100), np.float32), "non-empty mono"),
    (np.full(100, np.nan, np.float32), "NaN"),
])
def test_encode_rejects_bad_waveforms(spread_codec, wave, match):
    with pytest.raises(CodecError, match=match):
        spread_codec.encode([wave])


def test_random_codec_decodes_but_cannot_encode(codec):
    small = Xcodec2Codec.from_config(codec.config, device="cpu", dtype="float32")
    assert small.decode([random_codes(3, 0)])[0].shape == (3 * HOP,)
    with pytest.raises(CodecError, match="cannot encode"):
        small.encode([np.zeros(320, np.float32)])


def test_load_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(CodecError, match="does not exist"):
        Xcodec2Codec.load(tmp_path / "nope")
    with pytest.raises(CodecError, match="no config.json"):
        Xcodec2Codec.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CodecError, match="not 'xcodec2'"):
        Xcodec2Codec.load(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        Xcodec2Codec.load(tmp_path.parent, dtype="int8")


def test_auto_device_and_dtype(kit_dir):
    auto = Xcodec2Codec.load(kit_dir / "codec", device="auto", dtype="auto")
    cuda = torch.cuda.is_available()
    assert auto.device.type == ("cuda" if cuda else "cpu")
    assert auto.dtype == (torch.bfloat16 if cuda else torch.float32)
