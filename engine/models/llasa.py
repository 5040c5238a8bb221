"""Llasa specifics: token layout (asserted from the tokenizer) and prompt building."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# defined with the settings (engine/config.py), which modules without torch read too
from engine.config import LLASA_CONTEXT as LLASA_CONTEXT

NUM_SPEECH_TOKENS = 65536  # X-codec2: one FSQ codebook, levels [4] * 8
DEFAULT_DATE_STRING = "26 Jul 2024"  # what Llama-3.1-8B's template pins; keeps ids stable

TEXT_START = "<|TEXT_UNDERSTANDING_START|>"
TEXT_END = "<|TEXT_UNDERSTANDING_END|>"
SPEECH_START = "<|SPEECH_GENERATION_START|>"
SPEECH_END = "<|SPEECH_GENERATION_END|>"
TTS_INSTRUCTION = "Convert the text to speech:"


def speech_token(code: int) -> str:
    return f"<|s_{code}|>"


@dataclass(frozen=True)
class LlasaLayout:
    """Where the Llasa control and speech tokens live in a vocabulary.

    The engine samples in an *output space* of `num_speech + 1` ids: speech-local ids
    `0..65535` (= X-codec2 codes) followed by the end-of-speech token.
    """

    text_start: int
    text_end: int
    speech_start: int
    speech_end: int
    first_speech: int
    vocab_size: int
    num_speech: int = NUM_SPEECH_TOKENS

    @property
    def eos_out(self) -> int:
        """Output-space id of `<|SPEECH_GENERATION_END|>`."""
        return self.num_speech

    @property
    def vocab_out(self) -> int:
        return self.num_speech + 1

    def output_token_ids(self) -> torch.Tensor:
        """`[V_out]` vocabulary id of every output-space id."""
        speech = torch.arange(self.num_speech, dtype=torch.long) + self.first_speech
        return torch.cat([speech, torch.tensor([self.speech_end])])

    @classmethod
    def from_tokenizer(cls, tokenizer, model_vocab_size: int | None = None) -> LlasaLayout:
        """Read the layout off a tokenizer and check it, instead of trusting constants.

        Raises:
            ValueError: a control token is missing, the speech tokens are not one contiguous
                run of 65,536 ids, or the model's embedding table is too small for them.
        """
        unk = tokenizer.unk_token_id

        def token_id(token: str) -> int:
            tid = tokenizer.convert_tokens_to_ids(token)
            if tid is None or tid == unk:
                raise ValueError(f"tokenizer has no {token!r}: not a Llasa tokenizer")
            return int(tid)

        first = token_id(speech_token(0))
        ids = tokenizer.convert_tokens_to_ids([speech_token(i) for i in range(NUM_SPEECH_TOKENS)])
        if any(tid is None for tid in ids) or ids != list(range(first, first + NUM_SPEECH_TOKENS)):
            raise ValueError(
                f"speech tokens <|s_0|>..<|s_{NUM_SPEECH_TOKENS - 1}|> are not contiguous "
                f"from id {first}: not a Llasa/X-codec2 tokenizer"
            )
        vocab = model_vocab_size if model_vocab_size is not None else len(tokenizer)
        if first + NUM_SPEECH_TOKENS > vocab:
            raise ValueError(
                f"speech tokens end at id {first + NUM_SPEECH_TOKENS - 1} but the model's "
                f"vocabulary has {vocab} rows"
            )
        layout = cls(
            text_start=token_id(TEXT_START),
            text_end=token_id(TEXT_END),
            speech_start=token_id(SPEECH_START),
            speech_end=token_id(SPEECH_END),
            first_speech=first,
            vocab_size=vocab,
        )
        if first <= layout.speech_end < first + NUM_SPEECH_TOKENS:
            raise ValueError("<|SPEECH_GENERATION_END|> lies inside the speech-token range")
        return layout


class LlasaPrompter:
    """Builds Llasa TTS prompt ids with a pinned date, so draft and target see identical ids.

    Args:
        tokenizer: a Hugging Face tokenizer with a Llama-3 chat template.
        layout: the checked token layout.
        date_string: the date the chat template prints; pinned for reproducibility.
    """

    def __init__(self, tokenizer, layout: LlasaLayout, date_string: str = DEFAULT_DATE_STRING):
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
    ) -> list[int]:
        """Prompt ids for `text`, optionally cloning a voice from `(prompt_text, prompt_codes)`.

        The assistant turn is left open after `<|SPEECH_GENERATION_START|>` and the voice
        prompt's speech tokens, so the model continues with the new utterance's codes.

        Raises:
            ValueError: empty text, or prompt codes outside `0..65535`.
        """
        if not text or not text.strip():
            raise ValueError("text is empty")
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
        if ids[-1] != self.layout.speech_start:
            raise ValueError("chat template did not end the prompt with <|SPEECH_GENERATION_START|>")
        codes = list(prompt_codes or [])
        bad = [c for c in codes if not 0 <= int(c) < self.layout.num_speech]
        if bad:
            raise ValueError(f"voice-prompt codes outside 0..{self.layout.num_speech - 1}: {bad[:5]}")
        return ids + [self.layout.first_speech + int(c) for c in codes]
