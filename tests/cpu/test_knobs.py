"""The per-row sampling knobs are described once (`engine.knobs.KNOBS`): every knob reaches the
job's settings, a manifest row's overrides, an item's overrides and the round state, with its
bounds and default, and the round's plan steps are what the rows need."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from engine.config import DecodingSettings, Warp, decoding_default
from engine.decoding.graphs import describe
from engine.decoding.round import RoundPlan, RoundState
from engine.decoding.sampling import COLUMNS, WarpColumns
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import ExactRule
from engine.families import FAMILIES, GREEDY_OFF
from engine.io.manifest import ManifestRow
from engine.knobs import KNOB_NAMES, KNOBS, WARP_KNOBS, SamplingSteps
from engine.records import ITEM_SAMPLING_FIELDS, SynthesisItem

# a valid value other than the default, per knob (a test that misses a new knob fails below)
OTHER = {"temperature": 0.7, "top_p": 0.9, "top_k": 7, "repetition_penalty": 1.2, "max_new_tokens": 33}


def test_every_knob_has_a_value_here():
    assert set(OTHER) == set(KNOB_NAMES)


@pytest.mark.parametrize("knob", KNOBS, ids=KNOB_NAMES)
def test_a_knob_is_a_settings_field_with_its_default_bounds_and_description(knob):
    info = DecodingSettings.model_fields[knob.name]
    assert info.annotation is knob.type and info.description == knob.description
    assert decoding_default(knob.name) == knob.default
    assert DecodingSettings(**{knob.name: OTHER[knob.name]}).model_dump()[knob.name] == OTHER[knob.name]
    low = knob.bounds.get("ge", knob.bounds.get("gt"))
    with pytest.raises(ValueError, match=knob.name):
        DecodingSettings(**{knob.name: low - 1})


@pytest.mark.parametrize("knob", KNOBS, ids=KNOB_NAMES)
def test_a_knob_is_a_manifest_rows_and_an_items_override(knob):
    value = OTHER[knob.name]
    row = ManifestRow(id="a", text="Hello.", **{knob.name: value})
    assert row.overrides() == {knob.name: value}
    with pytest.raises(ValueError, match=knob.name):  # bounded as the settings field
        ManifestRow(id="a", text="Hello.", **{knob.name: knob.bounds.get("ge", knob.bounds.get("gt")) - 1})
    assert ManifestRow(id="a", text="Hello.").overrides() == {}
    item = SynthesisItem("Hello.", **{knob.name: value})
    assert item.overrides() == {knob.name: value}
    assert DecodingSettings().with_overrides(item.overrides()).model_dump()[knob.name] == value


def test_the_item_record_holds_a_field_per_knob_and_no_other_setting():
    """`SynthesisItem` spells its knob fields out (for the callers that build items): each is the
    knob's type or None, None by default."""
    item_fields = {f.name: f for f in dataclasses.fields(SynthesisItem)}
    assert ITEM_SAMPLING_FIELDS == KNOB_NAMES
    for knob in KNOBS:
        assert item_fields[knob.name].default is None
        assert item_fields[knob.name].type == f"{knob.type.__name__} | None"


def test_the_warp_and_the_round_state_hold_a_column_per_warp_knob():
    assert [f.name for f in dataclasses.fields(Warp)] == [k.name for k in WARP_KNOBS]
    assert COLUMNS == (*(k.column for k in WARP_KNOBS), "greedy")
    assert [f.name for f in dataclasses.fields(WarpColumns)] == list(COLUMNS)
    assert RoundState.__dataclass_fields__["sampling"].type == "WarpColumns"
    assert {"max_new_tokens"} == set(KNOB_NAMES) - {k.name for k in WARP_KNOBS}  # the row's limit instead


def test_the_greedy_settings_leave_off_what_the_knobs_say():
    assert GREEDY_OFF == tuple(k.name for k in KNOBS if k.greedy_off)
    with pytest.raises(ValueError, match=f"{'/'.join(GREEDY_OFF)} have no effect at temperature 0"):
        DecodingSettings(temperature=0, top_k=3)
    for family in FAMILIES.values():  # a family's sampling defaults are knobs
        assert set(family.sampling) <= set(KNOB_NAMES)


def test_a_decoder_writes_every_knob_of_a_row_into_its_slot(kit_synth):
    target = kit_synth.target.model
    decoder = SpeculativeDecoder(target, None, 0, 2, 256, kit_synth.layout.output_space())
    prompt = kit_synth.prompter.build("Hello.")
    warps = [Warp(0.0, repetition_penalty=1.3), Warp(**{k.name: OTHER[k.name] for k in WARP_KNOBS})]
    decoder.admit([0, 1], [Request(key=i, prompt_ids=prompt, seed=i, max_new_tokens=4, warp=w)
                           for i, w in enumerate(warps)])
    st = decoder.state
    state_tensors = {id(t) for t in st.tensors()}
    for knob in WARP_KNOBS:
        column = getattr(st.sampling, knob.column)
        assert column.dtype == getattr(torch, knob.dtype) and id(column) in state_tensors
        greedy_value = knob.greedy_as if knob.greedy_as is not None else getattr(warps[0], knob.name)
        assert column.tolist() == pytest.approx([greedy_value, OTHER[knob.name]])
    assert st.sampling.greedy.tolist() == [True, False]
    free = SpeculativeDecoder(target, None, 0, 2, 256, kit_synth.layout.output_space()).state.sampling
    assert all(getattr(free, k.column).tolist() == [k.off] * 2 for k in WARP_KNOBS)


def former_steps(warps, vocab):
    """The plan state as the decoder kept it in a dict before the knobs were described once."""
    met = {}
    for w in warps:
        greedy = w.temperature == 0
        met["sampled"] = met.get("sampled", False) or not greedy
        met["greedy"] = met.get("greedy", False) or greedy
        met["penalty"] = met.get("penalty", False) or w.repetition_penalty != 1.0
        met["top_p"] = met.get("top_p", False) or (not greedy and w.top_p < 1.0)
        top_k = 0 if greedy or w.top_k >= vocab else w.top_k
        met["max_top_k"] = max(met.get("max_top_k", 0), top_k)
    return met


def test_the_plan_steps_are_those_the_rows_need():
    grid = [Warp(t, top_p=p, top_k=k, repetition_penalty=r)
            for t, p, k, r in itertools.product((0.0, 0.8), (1.0, 0.9), (0, 5, 100), (1.0, 1.3))]
    for rows in itertools.chain(itertools.combinations(grid, 1), itertools.combinations(grid[::3], 3)):
        former, steps = former_steps(rows, 100), dataclasses.asdict(SamplingSteps.of(rows, vocab=100))
        assert {name: steps[name] for name in former} == former
    steps = SamplingSteps.of([Warp(0.0), Warp(0.8, top_p=0.9, top_k=30, repetition_penalty=1.2)])
    plan = RoundPlan(3, (ExactRule(),), steps, 64)
    assert describe(plan) == "exact gamma 3, sampled/greedy/penalty/top_p/top_k30, keys 64"
    assert describe(RoundPlan(0, (), SamplingSteps.of([Warp(0.0)]), 128)) == "ar gamma 0, greedy, keys 128"
