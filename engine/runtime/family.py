"""The model family of a job's target, found by the driver without loading a model: from the
target's `tokenizer.json` (`families.base.TokenTable`), read through storage (a local directory,
an object-store URI, or a Hugging Face Hub model's cached snapshot)."""

from __future__ import annotations

from engine.config import JobSpec
from engine.families import Family, SpeechLayout, check_max_new_tokens, family_settings, resolve
from engine.families.base import TokenTable
from engine.io.storage import Storage, StorageError, hub_ref, join


def target_tokens(storage: Storage, ref: str) -> TokenTable:
    """The token table of the checkpoint `ref`.

    Raises:
        ValueError: no readable `tokenizer.json` there.
    """
    try:
        if hub_ref(ref) is not None:
            data = (storage.local_dir(ref) / "tokenizer.json").read_bytes()
        else:
            data = storage.read_bytes(join(ref.rstrip("/"), "tokenizer.json"))
        return TokenTable.from_json(data)
    except (OSError, StorageError, ValueError) as exc:
        raise ValueError(f"{ref}: cannot read its tokenizer.json, which names the model family ({exc})") from None


def target_family(spec: JobSpec, storage: Storage) -> tuple[Family, SpeechLayout]:
    """The family of `models.target` (checked against `models.family`) and its token layout.

    Raises:
        ValueError: `models.target: why` (no tokenizer, a family the engine does not know, or
            not the family the spec names).
    """
    try:
        tokens = target_tokens(storage, spec.models.target)
        family = resolve(tokens, spec.models.family, spec.models.target)
        return family, family.layout(tokens)
    except ValueError as exc:
        raise ValueError(f"models.target: {exc}") from None


def with_family(spec: JobSpec, storage: Storage) -> tuple[JobSpec, Family, SpeechLayout]:
    """`spec` with its decoding settings as its target's family has them (`family_settings`: the
    family's sampling defaults where the spec leaves a field unset), the family and its layout:
    what the driver plans, records in `_job.json`, summarises and ships to the workers.

    Raises:
        ValueError: as `target_family`; `decoding.max_new_tokens: why`, a budget above the
            family's context (`check_max_new_tokens`).
    """
    family, layout = target_family(spec, storage)
    try:
        check_max_new_tokens(spec.decoding.max_new_tokens, family.context, family.name)
    except ValueError as exc:
        raise ValueError(f"decoding.{exc}") from None
    return spec.model_copy(update={"decoding": family_settings(spec.decoding, family)}), family, layout
