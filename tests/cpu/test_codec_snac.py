"""SNAC codec on a tiny random checkpoint: Orpheus's frame layout, loading, batched decoding,
keyed decoder noise, encoding, errors and fingerprints."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from snac import SNAC
from snac.layers import NoiseBlock

from engine.codec.base import Codec, CodecError
from engine.codec.snac import SnacCodec, frames_to_levels, levels_to_frames, noise_seed, orpheus_layout
from engine.kit.codec import TINY_SNAC_CONFIG, write_random_snac

FRAME = 2048  # samples a frame at 24 kHz: hop 2*4*8*8 = 512 times vq_strides[0] = 4
REAL_24KHZ = {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
              "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
              "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}  # hubertsiuzdak/snac_24khz


@pytest.fixture(scope="module")
def snac_dir(tmp_path_factory):
    return write_random_snac(tmp_path_factory.mktemp("snac") / "codec", TINY_SNAC_CONFIG, seed=3)


@pytest.fixture(scope="module")
def codec(snac_dir) -> SnacCodec:
    return SnacCodec.load(snac_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(snac_dir) -> SNAC:
    """The snac package's own loader on the same directory."""
    return SNAC.from_pretrained(str(snac_dir))


def random_codes(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, 7 * frames)


def orpheus_levels(frame: list[int]) -> list[torch.Tensor]:
    """canopyai/Orpheus-TTS decoder.py `convert_to_audio`'s loop, transcribed (token offsets already
    removed): the `[1, T_level]` codes it hands `model.decode`."""
    codes_0, codes_1, codes_2 = [], [], []
    num_frames = len(frame) // 7
    for j in range(num_frames):
        i = 7 * j
        codes_0.append(frame[i])
        codes_1.append(frame[i + 1])
        codes_1.append(frame[i + 4])
        codes_2.append(frame[i + 2])
        codes_2.append(frame[i + 3])
        codes_2.append(frame[i + 5])
        codes_2.append(frame[i + 6])
    return [torch.tensor(c, dtype=torch.long)[None] for c in (codes_0, codes_1, codes_2)]


def orpheus_frames(levels: list[torch.Tensor]) -> list[int]:
    """The inverse of `orpheus_levels`, written frame by frame (one item)."""
    l0, l1, l2 = (lv[0].tolist() for lv in levels)
    out = []
    for j in range(len(l0)):
        out += [l0[j], l1[2 * j], l2[4 * j], l2[4 * j + 1], l1[2 * j + 1], l2[4 * j + 2], l2[4 * j + 3]]
    return out


def keyed_reference_decode(ref: SNAC, codes: np.ndarray) -> np.ndarray:
    """`SNAC.decode` of Orpheus-ordered levels with each NoiseBlock's `torch.randn` replaced by noise
    from a CPU generator seeded with `noise_seed(item codes, block index)`. `codes`: `[B, 7T]`."""
    blocks = [m for m in ref.decoder.modules() if isinstance(m, NoiseBlock)]
    assert len(blocks) == 4  # one per decoder block

    def keyed(block, index):
        def forward(x):
            gens = [torch.Generator().manual_seed(noise_seed(row, index)) for row in codes]
            noise = torch.cat([torch.randn((1, 1, x.shape[-1]), generator=g) for g in gens])
            return x + noise * block.linear(x)
        return forward

    for i, block in enumerate(blocks):
        block.forward = keyed(block, i)
    try:
        levels = [torch.cat(parts) for parts in zip(*(orpheus_levels(list(row)) for row in codes))]
        with torch.no_grad():
            return ref.decode(levels)[:, 0].numpy()  # [B, samples]
    finally:
        for block in blocks:
            del block.forward


# ---- the frame layout -------------------------------------------------------------------------

def test_frames_to_levels_literal_example():
    l0, l1, l2 = frames_to_levels(torch.arange(14)[None])
    assert l0.tolist() == [[0, 7]]
    assert l1.tolist() == [[1, 4, 8, 11]]
    assert l2.tolist() == [[2, 3, 5, 6, 9, 10, 12, 13]]


def test_frames_to_levels_matches_orpheus_loop():
    codes = torch.from_numpy(np.stack([np.random.default_rng(s).permutation(4096)[: 7 * 9] for s in range(3)]))
    levels = frames_to_levels(codes)
    for b in range(3):
        want = orpheus_levels(codes[b].tolist())
        for got, ref in zip(levels, want):
            assert torch.equal(got[b : b + 1], ref)


def test_levels_to_frames_inverts_and_matches_orpheus_order():
    codes = torch.from_numpy(np.stack([np.random.default_rng(s).permutation(4096)[: 7 * 6] for s in range(2)]))
    assert torch.equal(levels_to_frames(frames_to_levels(codes)), codes)
    levels = [torch.randint(0, 4096, (1, n * 5), generator=torch.Generator().manual_seed(n)) for n in (1, 2, 4)]
    assert levels_to_frames(levels)[0].tolist() == orpheus_frames(levels)


def test_levels_to_frames_rejects_bad_shapes():
    good = [torch.zeros(1, n, dtype=torch.long) for n in (3, 6, 12)]
    with pytest.raises(CodecError, match="expected 3 SNAC levels"):
        levels_to_frames(good[:2])
    with pytest.raises(CodecError, match=r"level 2 has shape \(1, 11\)"):
        levels_to_frames([*good[:2], torch.zeros(1, 11, dtype=torch.long)])


# ---- loading ---------------------------------------------------------------------------------

def test_implements_codec_interface(codec):
    assert isinstance(codec, Codec)
    assert (codec.sample_rate, codec.frame_codes, codec.frame_samples, codec.codebook_size) == (24000, 7, FRAME, 4096)


def test_tiny_config_is_the_real_one_with_small_widths():
    differ = {k for k in REAL_24KHZ if TINY_SNAC_CONFIG[k] != REAL_24KHZ[k]}
    assert set(TINY_SNAC_CONFIG) == set(REAL_24KHZ) and differ == {"encoder_dim", "decoder_dim"}
    assert orpheus_layout(REAL_24KHZ) == (7, FRAME)


def test_decode_matches_snac_package(codec, reference):
    """SNAC.from_pretrained on the written directory, fed Orpheus's levels with the same keyed noise,
    decodes what SnacCodec decodes."""
    codes = np.stack([random_codes(6, 0), random_codes(6, 1)])
    want = keyed_reference_decode(reference, codes)
    got = np.stack(codec.decode(list(codes)))
    assert got.shape == want.shape == (2, 6 * FRAME)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_noise_matters_and_is_keyed_on_the_codes(codec, reference):
    codes = random_codes(5, 7)
    levels = orpheus_levels(list(codes))
    with torch.no_grad():
        a, b = (reference.decode(levels)[0, 0].numpy() for _ in range(2))  # the package's global-RNG noise
    assert np.abs(a - b).max() > 1e-2  # the decoder's noise is audible, so it has to be keyed
    once, again = codec.decode([codes])[0], codec.decode([codes])[0]
    np.testing.assert_array_equal(once, again)


def test_noise_seeds_differ_by_block_and_item():
    codes = random_codes(3, 1)
    changed = codes.copy()
    changed[-1] ^= 1
    seeds = {noise_seed(c, block) for c in (codes, changed) for block in range(4)}
    assert len(seeds) == 8 and noise_seed(codes.copy(), 2) == noise_seed(codes, 2)


def test_without_noise_decode_matches_the_untouched_package(tmp_path):
    config = dict(TINY_SNAC_CONFIG, noise=False)
    path = write_random_snac(tmp_path / "quiet", config, seed=5)
    codes = random_codes(4, 2)
    with torch.no_grad():
        want = SNAC.from_pretrained(str(path)).decode(orpheus_levels(list(codes)))[0, 0].numpy()
    np.testing.assert_allclose(SnacCodec.load(path).decode([codes])[0], want, rtol=0, atol=1e-5)


def test_from_config_decodes_like_the_written_checkpoint(codec):
    """write_random_snac changes only the encode path of from_config's weights."""
    same = SnacCodec.from_config(TINY_SNAC_CONFIG, seed=3)
    other = SnacCodec.from_config(TINY_SNAC_CONFIG, seed=4)
    codes = random_codes(3, 9)
    want = codec.decode([codes])[0]
    np.testing.assert_allclose(same.decode([codes])[0], want, rtol=0, atol=1e-6)
    assert np.abs(other.decode([codes])[0] - want).max() > 1e-2


def test_safetensors_weights_load_the_same(codec, snac_dir, tmp_path):
    from safetensors.torch import save_file

    state = torch.load(snac_dir / "pytorch_model.bin", weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_bytes((snac_dir / "config.json").read_bytes())
    codes = random_codes(2, 4)
    np.testing.assert_array_equal(SnacCodec.load(tmp_path).decode([codes])[0], codec.decode([codes])[0])


def test_write_random_snac_is_seeded_and_leaves_the_rng_alone(snac_dir, tmp_path):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    write_random_snac(tmp_path / "again", TINY_SNAC_CONFIG, seed=3)
    assert torch.equal(torch.rand(3), expected)
    written = [torch.load(d / "pytorch_model.bin", weights_only=True) for d in (snac_dir, tmp_path / "again")]
    assert written[0].keys() == written[1].keys()
    assert all(torch.equal(written[0][k], written[1][k]) for k in written[0])
    assert json.loads((snac_dir / "config.json").read_text()) == TINY_SNAC_CONFIG


# ---- decoding --------------------------------------------------------------------------------

def test_batched_equals_single_in_input_order(codec):
    frames = [5, 9, 5, 12, 9, 1, 5]
    items = [random_codes(n, i) for i, n in enumerate(frames)]
    items[6] = items[0].copy()  # same codes, another batch position
    out = codec.decode(items)
    assert [w.shape for w in out] == [(n * FRAME,) for n in frames]
    assert all(w.dtype == np.float32 and np.isfinite(w).all() for w in out)
    for item, wav in zip(items, out):
        np.testing.assert_allclose(wav, codec.decode([item])[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out[6], out[0], rtol=0, atol=1e-5)
    assert np.abs(out[0] - out[2]).max() > 1e-2  # equal lengths, different codes: order is checked


def test_max_batch_splits_without_changing_audio(codec, snac_dir):
    small = SnacCodec.load(snac_dir, max_batch=2)
    items = [random_codes(3, s) for s in range(5)]
    for a, b in zip(small.decode(items), codec.decode(items)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_decode_iter_streams_in_order(codec):
    items = [random_codes(n, n) for n in (2, 4, 2, 3, 1)]
    streamed = list(codec.decode_iter(iter(items), window=2))
    for a, b in zip(streamed, codec.decode(items), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)  # other batches: float rounding only


# ---- encoding --------------------------------------------------------------------------------

def clip(n: int, seed: int) -> np.ndarray:
    """A gliding tone with a wandering envelope: speech-like variation, no steady state."""
    rng = np.random.default_rng(seed)
    freq = 100 + 300 * np.abs(np.cumsum(rng.standard_normal(n))) / math.sqrt(n)
    envelope = 0.2 + 0.6 * np.abs(np.sin(np.linspace(0, rng.uniform(3, 9), n)))
    return (envelope * np.sin(2 * np.pi * np.cumsum(freq) / 24000)).astype(np.float32)


def test_encode_gives_whole_frames_in_range(codec):
    lengths = [5000, FRAME, 24000]
    codes = codec.encode([clip(n, i) for i, n in enumerate(lengths)])
    assert [len(c) for c in codes] == [7 * math.ceil(n / FRAME) for n in lengths]
    assert all(0 <= x < 4096 for c in codes for x in c)
    decoded = codec.decode(codes)
    assert [len(w) for w in decoded] == [math.ceil(n / FRAME) * FRAME for n in lengths]


def test_encode_gives_varied_codes(codec):
    clips = [clip(48000, s) for s in range(3)]
    codes = codec.encode(clips)
    for c in codes:
        assert len(set(c)) > len(c) // 2  # a random SNAC without spread_snac_codes: ~10% distinct
        level2 = np.asarray(c).reshape(-1, 7)[:, [2, 3, 5, 6]]
        assert (level2[:, 0] != level2[:, 1]).mean() > 0.5  # neighbouring level-2 codes differ
    assert len({tuple(c) for c in codes}) == 3


def test_encode_matches_snac_package(codec, reference):
    wav = clip(20000, 5)
    with torch.no_grad():
        levels = reference.encode(torch.from_numpy(wav)[None, None])
    assert codec.encode([wav])[0] == orpheus_frames(levels)


@pytest.mark.parametrize("wave, match", [
    (np.zeros(0, np.float32), "non-empty mono"),
    (np.zeros((2, 100), np.float32), "non-empty mono"),
    (np.full(100, np.nan, np.float32), "NaN"),
])
def test_encode_rejects_bad_waveforms(codec, wave, match):
    with pytest.raises(CodecError, match=match):
        codec.encode([wave])


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("items, match", [
    ([random_codes(2, 0), np.array([4096] * 7)], r"item 1: code 4096 at position 0 is outside \[0, 4096\)"),
    ([np.array([0, 1, 2, 3, 4, 5, -1])], r"item 0: code -1 at position 6"),
    ([np.arange(10)], "item 0: 10 codes are not whole frames of 7"),
    ([np.array([], dtype=np.int64)], "item 0: no codes to decode"),
    ([np.zeros((2, 7), dtype=np.int64)], r"item 0: expected a flat list of codes, got shape \(2, 7\)"),
    ([np.zeros(7, dtype=np.float32)], "item 0: codes must be integers"),
])
def test_bad_codes_are_refused(codec, items, match):
    with pytest.raises(CodecError, match=match):
        codec.decode(items)


def test_load_errors_say_what_is_wrong(tmp_path, snac_dir):
    with pytest.raises(CodecError, match="does not exist.*hubertsiuzdak/snac_24khz"):
        SnacCodec.load(tmp_path / "nope")
    with pytest.raises(CodecError, match="no config.json"):
        SnacCodec.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "xcodec2", "hop_length": 320}))
    with pytest.raises(CodecError, match="not a SNAC checkpoint.*'xcodec2'.*hubertsiuzdak/snac_24khz"):
        SnacCodec.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_SNAC_CONFIG, vq_strides=[8, 4, 2, 1])))
    with pytest.raises(CodecError, match=r"4 levels of \(1, 2, 4, 8\).*Orpheus needs three levels"):
        SnacCodec.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY_SNAC_CONFIG))
    with pytest.raises(CodecError, match="no SNAC weights"):
        SnacCodec.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_SNAC_CONFIG, decoder_dim=32)))
    (tmp_path / "pytorch_model.bin").write_bytes((snac_dir / "pytorch_model.bin").read_bytes())
    with pytest.raises(CodecError, match="does not fit its config.json"):
        SnacCodec.load(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        SnacCodec.load(snac_dir, dtype="int8")


def test_from_config_refuses_other_layouts():
    with pytest.raises(CodecError, match="attn_window_size 32"):
        SnacCodec.from_config(dict(TINY_SNAC_CONFIG, attn_window_size=32))
    with pytest.raises(CodecError, match="cannot be built"):
        SnacCodec.from_config(dict(TINY_SNAC_CONFIG, model_type="snac"))


# ---- fingerprint -----------------------------------------------------------------------------

def test_fingerprint_hashes_config_and_weights(codec, snac_dir, tmp_path):
    want = hashlib.sha256((snac_dir / "config.json").read_bytes() + (snac_dir / "pytorch_model.bin").read_bytes())
    assert codec.fingerprint == want.hexdigest() == SnacCodec.load(snac_dir).fingerprint
    other = SnacCodec.load(write_random_snac(tmp_path / "other", TINY_SNAC_CONFIG, seed=4))
    assert other.fingerprint != codec.fingerprint
    with pytest.raises(CodecError, match="no fingerprint"):
        _ = SnacCodec.from_config(TINY_SNAC_CONFIG).fingerprint


def test_auto_device_and_dtype(snac_dir):
    auto = SnacCodec.load(snac_dir, device="auto", dtype="auto")
    cuda = torch.cuda.is_available()
    assert auto.device.type == ("cuda" if cuda else "cpu")
    assert auto.dtype == (torch.bfloat16 if cuda else torch.float32)


def test_decoded_length_is_exactly_whole_frames():
    longer = SnacCodec.from_config(dict(TINY_SNAC_CONFIG, decoder_rates=[8, 8, 4, 4]))  # 1,024 samples a step
    assert longer.decode([random_codes(3, 0)])[0].shape == (3 * FRAME,)  # trimmed
    shorter = SnacCodec.from_config(dict(TINY_SNAC_CONFIG, decoder_rates=[8, 8, 2, 2]))
    with pytest.raises(CodecError, match=f"decoded {3 * FRAME // 2} samples for 3 frames, fewer than {3 * FRAME}"):
        shorter.decode([random_codes(3, 0)])
