"""`pcg-synth codec ...`: codec utilities (registered by `engine.cli`)."""

from __future__ import annotations

import json
from pathlib import Path


def codec_dir_from(args) -> Path:
    if args.codec:
        return Path(args.codec)
    if args.kit:
        return Path(args.kit) / "codec"
    raise ValueError("give --codec DIR (an X-codec2 or SNAC checkpoint) or --kit DIR (a tiny kit)")


def cmd_encode(args) -> int:
    """Encode one clip; print the codes as JSON or write them to --out."""
    from engine.codec.audio import read_wave, resample
    from engine.codec.base import seconds
    from engine.codec.load import load_codec
    from engine.codec.prompts import PromptCache, prompt_id

    waveform, rate = read_wave(args.clip)  # unreadable clips fail before the codec loads
    codec_dir = codec_dir_from(args)
    codec = load_codec(codec_dir, device="cpu", dtype="float32", encoder_device=args.device)
    codes = PromptCache(args.cache_dir).encode(codec, resample(waveform, rate, codec.sample_rate))
    doc = {"clip": str(args.clip), "codec": str(codec_dir), "sample_rate": codec.sample_rate,
           "num_codes": len(codes), "duration": seconds(codec, len(codes)),
           "codes": codes}
    if args.text and args.text.strip():
        text = args.text.strip()
        doc.update(id=prompt_id(text, codes), text=text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc))
        print(f"{doc['num_codes']} codes ({doc['duration']:.2f} s) of {args.clip} written to {out}")
    else:
        print(json.dumps(doc))
    return 0


def register(sub) -> None:
    """Add the `codec` command (subcommand `encode`) to `pcg-synth`'s subparsers."""
    codec = sub.add_parser("codec", help="codec utilities (encode voice-prompt clips)")
    csub = codec.add_subparsers(dest="codec_cmd", required=True)
    enc = csub.add_parser("encode", help="encode a clip into the codec's codes (X-codec2 or SNAC)",
                          description="Read a WAV/FLAC clip (any sample rate; resampled to 16 kHz "
                                      "mono), encode it with X-codec2 and print the codes as JSON "
                                      "(or write them with --out). With --text the JSON is a voice "
                                      "prompt: {id, text, codes}.")
    enc.add_argument("clip", help="WAV or FLAC file")
    enc.add_argument("--codec", help="the codec's checkpoint directory: X-codec2 (transformers format) or SNAC")
    enc.add_argument("--kit", help="a tiny kit directory (uses DIR/codec)")
    enc.add_argument("--text", help="the clip's transcript (makes the output a voice prompt)")
    enc.add_argument("--out", help="write the JSON here instead of printing it")
    enc.add_argument("--cache-dir", help="reuse/keep codes of clips encoded before (by content hash)")
    enc.add_argument("--device", default="cpu", help="where the encoder runs: cpu | cuda | cuda:N")
    enc.set_defaults(func=cmd_encode)
