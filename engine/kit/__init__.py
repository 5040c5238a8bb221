"""The tiny model kit: a complete, small, deterministic Llasa-format model set (target, draft,
X-codec2, tokenizer) for tests, the quickstart and benchmarks; `pcg-synth kit build DIR`.

    build.py      the weight recipe and `build_kit` (also the `llasa-1b-shape` bench preset's recipe)
    tokenizer.py  byte-level BPE + Llama-3 control tokens + Llasa's 65,536 speech tokens
    draft.py      the kit's draft: a layer subset of the target, distilled by `engine.draft`
    codec.py      a small random X-codec2 whose encoder spreads clips over the codebook
"""

from engine.kit.build import KIT_VERSION, KitSpec, build_kit

__all__ = ["KIT_VERSION", "KitSpec", "build_kit"]
