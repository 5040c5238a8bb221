"""Results -> Parquet + audio files (`export_audio`) and the `pcg-synth codec encode` command."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from engine.codec.audio import read_audio_bytes, read_clip, to_pcm16
from engine.codec.cli import register
from engine.codec.export import AudioOutput, export_audio, file_name
from engine.codec.prompts import VoicePrompt
from engine.codec.xcodec2 import Xcodec2Codec
from engine.config import DecodingSettings
from engine.records import RowStats, SynthesisResult

HOP = 320
SETTINGS = DecodingSettings(method="exact")


@pytest.fixture(scope="module")
def codec(kit_dir) -> Xcodec2Codec:
    return Xcodec2Codec.load(kit_dir / "codec", device="cpu", dtype="float32")


def result(item_id: str, codes: list[int], **kw) -> SynthesisResult:
    return SynthesisResult(id=item_id, text=f"text of {item_id}", seed=1, codes=codes,
                           finish_reason=kw.pop("finish_reason", "eos"),
                           stats=RowStats(rounds=2, emitted=len(codes)), **kw)


def mixed_results() -> list[SynthesisResult]:
    rng = np.random.default_rng(0)
    return [
        result("a", rng.integers(0, 65536, 12).tolist()),
        result("b/slash", rng.integers(0, 65536, 7).tolist()),
        result("empty", [], finish_reason="eos"),
        result("oob", [1, 2, 65536]),
        SynthesisResult(id="failed", text="t", seed=2, error="prompt is 3000 tokens"),
        result("c", rng.integers(0, 65536, 12).tolist()),
    ]


def test_export_parquet_and_wav_dir(codec, tmp_path):
    results = mixed_results()
    summary = export_audio(results, SETTINGS, codec, AudioOutput(tmp_path / "out.parquet", tmp_path / "wavs",
                                                                 window=4))
    assert summary["rows"] == 6 and summary["with_audio"] == 3 and summary["failed"] == 3
    assert summary["audio_seconds"] == pytest.approx((12 + 7 + 12) * HOP / 16000)
    table = pq.read_table(tmp_path / "out.parquet")
    col = table.to_pydict()
    assert col["id"] == [r.id for r in results]  # input order across windows
    assert col["error"][:2] == [None, None] and col["error"][5] is None
    assert "no speech codes" in col["error"][2]
    assert "65536 at position 2" in col["error"][3]
    assert col["error"][4] == "prompt is 3000 tokens"
    assert col["duration"] == [12 * HOP / 16000, 7 * HOP / 16000, None, None, None, 12 * HOP / 16000]
    assert col["method"] == ["exact"] * 6
    want = codec.decode([results[0].codes])[0]
    samples, sr = read_audio_bytes(col["audio"][0]["bytes"])
    assert sr == 16000
    np.testing.assert_array_equal(samples, to_pcm16(want))
    files = sorted(p.name for p in (tmp_path / "wavs").iterdir())
    assert files == sorted(["a.wav", file_name("b/slash", "wav"), "c.wav"])
    for name, cell in [("a.wav", col["audio"][0]), ("c.wav", col["audio"][5])]:
        assert (tmp_path / "wavs" / name).read_bytes() == cell["bytes"]
        assert cell["path"] == name


def test_prompt_audio_modes(codec, tmp_path):
    prompt = VoicePrompt(id="spk", text="ref", codes=tuple(range(100, 110)))
    res = [result("x", list(range(500, 515)))]
    decoded = {}
    for mode in ("strip", "include", "context"):
        export_audio(res, SETTINGS, codec, AudioOutput(tmp_path / f"{mode}.parquet", prompt_audio=mode),
                     prompts=[prompt])
        row = pq.read_table(tmp_path / f"{mode}.parquet").to_pylist()[0]
        assert row["prompt_id"] == "spk" and row["prompt_audio"] == mode
        assert row["codes"] == res[0].codes  # the generated codes only, in every mode
        decoded[mode] = read_audio_bytes(row["audio"]["bytes"])[0]
    assert len(decoded["strip"]) == 15 * HOP
    assert len(decoded["include"]) == 25 * HOP
    assert len(decoded["context"]) == 15 * HOP
    np.testing.assert_array_equal(decoded["strip"], to_pcm16(codec.decode([res[0].codes])[0]))
    # context = the tail of decoding prompt + generated codes together (the prompt's audio cut)
    np.testing.assert_array_equal(decoded["context"], decoded["include"][10 * HOP:])


def test_flac_export_to_file_like(codec, tmp_path):
    import io

    buf = io.BytesIO()
    summary = export_audio([result("f", [1, 2, 3])], SETTINGS, codec,
                           AudioOutput(buf, tmp_path / "w", audio_format="flac"))
    assert summary["parquet"] is None and summary["format"] == "flac"
    row = pq.read_table(io.BytesIO(buf.getvalue())).to_pylist()[0]
    assert row["audio"]["bytes"][:4] == b"fLaC" and row["audio"]["path"] == "f.flac"
    data, sr = sf.read(tmp_path / "w" / "f.flac", dtype="int16")
    assert sr == 16000 and len(data) == 3 * HOP


def test_export_loads_the_codec_from_its_directory(kit_dir, tmp_path):
    summary = export_audio([result("k", [9, 8, 7])], SETTINGS, kit_dir / "codec", AudioOutput(tmp_path / "k.parquet"))
    assert summary["with_audio"] == 1 and (tmp_path / "k.parquet").is_file()


@pytest.mark.parametrize("kwargs, match", [
    (dict(parquet_path=None, wav_dir=None), "nothing to write"),
    (dict(audio_format="mp3"), "wav, flac"),
    (dict(prompt_audio="keep"), "strip, include, context"),
    (dict(prompts=[None, None]), "2 prompts for 1 results"),
])
def test_export_argument_errors(codec, tmp_path, kwargs, match):
    args = dict(parquet_path=tmp_path / "x.parquet", wav_dir=None) | kwargs
    prompts = args.pop("prompts", None)
    with pytest.raises(ValueError, match=match):
        export_audio([result("a", [1])], SETTINGS, codec, AudioOutput(**args), prompts=prompts)
    assert not (tmp_path / "x.parquet").exists()


def test_export_refuses_repeated_ids_for_files(codec, tmp_path):
    with pytest.raises(ValueError, match="ids repeat"):
        export_audio([result("a", [1]), result("a", [2])], SETTINGS, codec, AudioOutput(wav_dir=tmp_path))


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pcg-synth")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_codec_encode(kit_dir, tmp_path, capsys):
    from engine.kit.codec import write_spread_codec

    codec_dir = write_spread_codec(kit_dir / "codec", tmp_path / "codec")  # varied codes
    clip = tmp_path / "clip.flac"
    t = np.arange(22050) / 44100
    sf.write(clip, (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 44100)
    cache = str(tmp_path / "cache")
    assert run_cli(["codec", "encode", str(clip), "--codec", str(codec_dir), "--cache-dir", cache]) == 0
    printed = json.loads(capsys.readouterr().out)
    want = Xcodec2Codec.load(codec_dir).encode([read_clip(clip, 16000)])[0]
    assert len(set(want)) > 1
    assert printed["codes"] == want and printed["num_codes"] == 8000 // HOP + 1
    out = tmp_path / "prompt.json"  # second run: codes come from the cache
    assert run_cli(["codec", "encode", str(clip), "--codec", str(codec_dir), "--text", "Hi.",
                    "--out", str(out), "--cache-dir", cache]) == 0
    doc = json.loads(out.read_text())
    assert doc["codes"] == want and doc["text"] == "Hi." and doc["id"].startswith("p-")
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1


def test_cli_codec_encode_errors(kit_dir, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        run_cli(["codec", "encode", str(tmp_path / "none.wav"), "--kit", str(kit_dir)])
    junk = tmp_path / "junk.wav"
    junk.write_text("not audio")
    with pytest.raises(ValueError, match="cannot read audio clip"):
        run_cli(["codec", "encode", str(junk), "--kit", str(kit_dir)])
    clip = tmp_path / "ok.wav"
    sf.write(clip, np.zeros(1600, np.float32), 16000)
    with pytest.raises(ValueError, match="--codec DIR"):
        run_cli(["codec", "encode", str(clip)])
