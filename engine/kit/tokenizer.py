"""The tiny kit's tokenizer: byte-level BPE + Llama-3 control tokens + a family's speech tokens
(Llasa: its control tokens and 65,536 speech tokens; Orpheus: its custom tokens, controls and
7 x 4,096 codes).

Same formats as the real tokenizers (tokenizer.json, tokenizer_config.json with a Llama-3 chat
template), a much smaller text vocabulary, deterministic from its embedded corpus.
"""

from __future__ import annotations

from pathlib import Path

from engine.families import orpheus
from engine.families.llasa import (
    NUM_SPEECH_TOKENS,
    SPEECH_END,
    SPEECH_START,
    TEXT_END,
    TEXT_START,
    speech_token,
)
from engine.hf import from_transformers

BOS, EOT_TEXT = "<|begin_of_text|>", "<|end_of_text|>"
HEADER_START, HEADER_END, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
LLAMA_SPECIALS = [BOS, EOT_TEXT, HEADER_START, HEADER_END, EOT]
LLASA_SPECIALS = [
    "<|TEXT_GENERATION_START|>", "<|TEXT_GENERATION_END|>", TEXT_START, TEXT_END,
    SPEECH_START, SPEECH_END, "<|SPEECH_UNDERSTANDING_START|>", "<|SPEECH_UNDERSTANDING_END|>",
]

# The Llama-3 chat layout with a pinnable date (`date_string`), as Llasa's tokenizers render it.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if date_string is not defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

CORPUS = """
The quick brown fox jumps over the lazy dog. A speech synthesis engine turns written text
into spoken audio. Speculative decoding lets a small draft model propose tokens that a large
target model verifies in one forward pass. Acoustic similarity groups collect speech tokens
whose embeddings lie close together, so the target can accept a draft token that sounds like
the one it would have chosen. She sells sea shells by the sea shore. Peter Piper picked a peck
of pickled peppers. How much wood would a woodchuck chuck if a woodchuck could chuck wood?
It was the best of times, it was the worst of times. Call me Ishmael. In the beginning the
weather was cold and the river was frozen, but by spring the fields were green again.
Numbers like one, two, three, four, five, six, seven, eight, nine and ten appear in many
sentences; so do dates such as Monday the first of June, and places such as London, Paris,
Hong Kong and New York. Please call Stella and ask her to bring these things with her from the
store: six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for
her brother Bob. We also need a small plastic snake and a big toy frog for the kids.
"""


def family_specials(family: str) -> list[str]:
    """The special tokens a family's tokenizer adds after Llama-3's, in id order."""
    if family == "orpheus":
        return [orpheus.custom_token(n) for n in range(orpheus.FIRST_CODE + orpheus.FRAME * orpheus.CODEBOOK)]
    return LLASA_SPECIALS + [speech_token(i) for i in range(NUM_SPEECH_TOKENS)]


def build_tokenizer(out_dir: Path, text_vocab_size: int = 1024, family: str = "llasa"):
    """Train the kit tokenizer for `family` and save it in Hugging Face format under `out_dir`.

    Returns:
        The `PreTrainedTokenizerFast` that was saved.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    PreTrainedTokenizerFast = from_transformers("PreTrainedTokenizerFast")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=text_vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in CORPUS.strip().splitlines()]
    tok.train_from_iterator(lines, trainer)
    specials = LLAMA_SPECIALS + family_specials(family)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def write_transformers4_layout(src: Path, dst: Path) -> Path:
    """Copy a tokenizer saved by this transformers (`src`, e.g. the kit's target) to `dst` in the
    layout transformers 4 saves: class `PreTrainedTokenizerFast`, every added token listed in the
    config's `added_tokens_decoder`, the special tokens also in `special_tokens_map.json`. For
    tests and benchmarks of tokenizer loading."""
    import json
    import shutil

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    backend = json.loads((dst / "tokenizer.json").read_text())["added_tokens"]
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in backend}
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    specials = {k: config[k] for k in ("bos_token", "eos_token") if k in config}
    (dst / "special_tokens_map.json").write_text(json.dumps(specials))
    return dst
