"""The tiny model kit: a complete, small, deterministic model set of one family (Llasa: target,
draft, X-codec2, tokenizer; Orpheus: the same with SNAC) for tests, the quickstart and
benchmarks; `pcg-synth kit build [--family orpheus] DIR`.

    build.py      the weight recipe and `build_kit` (also the `llasa-1b-shape` bench preset's recipe)
    tokenizer.py  byte-level BPE + Llama-3 control tokens + the family's control and code tokens
    draft.py      the kit's draft: a layer subset of the target, distilled by `engine.draft`
    codec.py      small random codecs (X-codec2, SNAC) whose encoders spread clips over the codebook
"""

from engine.kit.build import KIT_VERSION, KitSpec, build_kit

__all__ = ["KIT_VERSION", "KitSpec", "build_kit"]
