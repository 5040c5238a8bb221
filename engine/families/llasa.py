"""Llasa (HKUSTAudio/Llasa-1B, -3B, -8B: Llama causal LMs) emitting X-codec2 codes.

Token layout (asserted from the tokenizer): the speech tokens `<|s_0|>`..`<|s_65535|>` are one
contiguous run (X-codec2 code = id - id of `<|s_0|>`), end of speech is
`<|SPEECH_GENERATION_END|>`. One frame is one code (16 kHz audio, 320 samples a code, 50 codes a
second). The prompt is Llama-3's chat layout with a pinned date (below).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.families.base import Family, SpeechLayout, check_codes_run, llama, token_id

NUM_SPEECH_TOKENS = 65536  # X-codec2: one FSQ codebook, levels [4] * 8
SAMPLE_RATE = 16_000  # X-codec2's audio
HOP = 320  # X-codec2: samples per code
CONTEXT = 2048  # tokens Llasa was trained with, prompt included
DEFAULT_DATE_STRING = "26 Jul 2024"  # what Llama-3.1-8B's template pins; keeps ids stable
DECODER_PARAMETERS = 187_000_000  # X-codec2's decode path (quantizer + acoustic decoder), what workers hold
# the published config.json of each released checkpoint (Llama-3.2-1B, -3B and Llama-3.1-8B bodies)
CHECKPOINTS = {
    "HKUSTAudio/Llasa-1B": llama(2048, 8192, 16, 32, 8, 64, 193_800, True),
    "HKUSTAudio/Llasa-3B": llama(3072, 8192, 28, 24, 8, 128, 193_800, True),
    "HKUSTAudio/Llasa-8B": llama(4096, 14336, 32, 32, 8, 128, 193_800, False),
}

TEXT_START = "<|TEXT_UNDERSTANDING_START|>"
TEXT_END = "<|TEXT_UNDERSTANDING_END|>"
SPEECH_START = "<|SPEECH_GENERATION_START|>"
SPEECH_END = "<|SPEECH_GENERATION_END|>"
TTS_INSTRUCTION = "Convert the text to speech:"


def speech_token(code: int) -> str:
    return f"<|s_{code}|>"


class LlasaPrompter:
    """Builds Llasa TTS prompt ids with a pinned date, so draft and target see identical ids.

    Args:
        tokenizer: a Hugging Face tokenizer with a Llama-3 chat template.
        layout: the checked token layout.
        date_string: the date the chat template prints; pinned for reproducibility.
    """

    def __init__(self, tokenizer, layout: SpeechLayout, date_string: str = DEFAULT_DATE_STRING):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template: Llasa prompts need one")
        self.tokenizer = tokenizer
        self.layout = layout
        self.date_string = date_string

    def build(
        self,
        text: str,
        prompt_text: str | None = None,
        prompt_codes: Sequence[int] | None = None,
        voice: str | None = None,
    ) -> list[int]:
        """Prompt ids for `text`, optionally cloning a voice from `(prompt_text, prompt_codes)`.

        The assistant turn is left open after `<|SPEECH_GENERATION_START|>` and the voice
        prompt's speech tokens, so the model continues with the new utterance's codes.

        Raises:
            ValueError: empty text, prompt codes outside `0..65535`, or a named `voice` (Llasa
                has none).
        """
        if not text or not text.strip():
            raise ValueError("text is empty")
        FAMILY.check_voice(voice)
        if prompt_text:
            text = f"{prompt_text.strip()} {text.strip()}"
        chat = [
            {"role": "user", "content": f"{TTS_INSTRUCTION}{TEXT_START}{text}{TEXT_END}"},
            {"role": "assistant", "content": SPEECH_START},
        ]
        ids = self.tokenizer.apply_chat_template(
            chat,
            tokenize=True,
            continue_final_message=True,
            date_string=self.date_string,
            return_dict=False,
            # no "longer than the maximum ... indexing errors" notice: the decoder measures a
            # prompt against its own context and refuses it with a clear error
            tokenizer_kwargs={"verbose": False},
        )
        ids = [int(i) for i in ids]
        if ids[-1] != self.layout.control("speech_start"):
            raise ValueError("chat template did not end the prompt with <|SPEECH_GENERATION_START|>")
        codes = list(prompt_codes or [])
        FAMILY.check_voice_prompt(self.layout, prompt_text, codes)
        return ids + self.layout.token_ids(codes)


class Llasa(Family):
    name = "llasa"
    title = "Llasa (Llama) + X-codec2"
    codec_name = "X-codec2"
    sample_rate = SAMPLE_RATE
    frame_samples = HOP
    cycle = 1
    context = CONTEXT
    codebook = NUM_SPEECH_TOKENS
    codec_parameters = (DECODER_PARAMETERS, 0)  # the decode path takes the models' dtype
    sampling = {"temperature": 0.8}  # the model card's
    checkpoints = CHECKPOINTS

    def detect(self, tokenizer) -> bool:
        unk = tokenizer.unk_token_id
        return all(tokenizer.convert_tokens_to_ids(t) not in (None, unk) for t in (speech_token(0), SPEECH_END))

    def layout(self, tokenizer, model_vocab_size: int | None = None) -> SpeechLayout:
        vocab = model_vocab_size if model_vocab_size is not None else len(tokenizer)
        first = check_codes_run(tokenizer, [speech_token(i) for i in range(NUM_SPEECH_TOKENS)], "Llasa", vocab)
        controls = {name: token_id(tokenizer, tok, "Llasa") for name, tok in (
            ("text_start", TEXT_START), ("text_end", TEXT_END), ("speech_start", SPEECH_START),
            ("speech_end", SPEECH_END))}
        if first <= controls["speech_end"] < first + NUM_SPEECH_TOKENS:
            raise ValueError(f"{SPEECH_END} lies inside the speech-token range")
        return SpeechLayout(family=self.name, first_code=first, codebook=NUM_SPEECH_TOKENS, cycle=1,
                            eos_token=controls["speech_end"], vocab_size=vocab, controls=tuple(controls.items()))

    def prompter(self, tokenizer, layout: SpeechLayout) -> LlasaPrompter:
        return LlasaPrompter(tokenizer, layout)


FAMILY = Llasa()
