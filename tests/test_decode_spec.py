"""generate()'s one path to the core: a DecodeSpec, checked field by field, becomes the core's bound
GenerateParams; generate(prompts, **fields) builds the same spec."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import PROMPTS

from specnative import DecodeSpec, _core
from specnative.engine import DraftShape


@pytest.mark.parametrize("fields, name", [
    ({"n_predict": 2.5}, "n_predict"),
    ({"n_predict": 2**40}, "n_predict"),
    ({"k": "4"}, "k"),
    ({"temperature": "0.5"}, "temperature"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"accept_rule": "typical"}, "accept_rule"),
    ({"drafter": "no-such-drafter"}, "drafter"),
    ({"drafter": 3}, "drafter"),
    ({"drafter_options": ["spec-ngram-mod-n-min"]}, "drafter_options"),
    ({"draft_p_min": 1.0}, "draft_p_min"),
    ({"draft_temperature": -1.0, "temperature": 0.5}, "draft_temperature"),
    ({"draft_temperature": 1.5}, "draft_temperature"),
    ({"record_pit": True}, "record_pit"),
    ({"prefix_limit": -1}, "prefix_limit"),
    ({"prefix_limit": True}, "prefix_limit"),
    ({"synthetic": "0.5"}, "synthetic acceptance"),
    ({"draft_shape": "tree:topk=0"}, "topk"),
    ({"draft_shape": "tree:topk=2,depth=2,budget=4", "spec": True, "drafter": "ngram-simple"}, "draft tree"),
])
def test_each_bad_field_is_one_value_error_naming_it(fields, name):
    with pytest.raises(ValueError, match=name):
        DecodeSpec(**fields)


def test_a_spec_is_kept_in_its_checked_form_and_replace_checks_again():
    spec = DecodeSpec(n_predict=np.int64(8), drafter="draft-simple", draft_shape="tree:topk=2,depth=2,budget=4",
                      drafter_options=None, seed=np.uint64(7), spec=1)
    assert (spec.n_predict, spec.drafter, spec.seed, spec.spec) == (8, "model", 7, True)
    assert type(spec.n_predict) is int and spec.drafter_options == {}
    assert spec.draft_shape == DraftShape("topk", topk=2, depth=2, budget=4)
    assert dataclasses.replace(spec, k=3).k == 3
    with pytest.raises(ValueError, match="accept_rule"):
        dataclasses.replace(spec, accept_rule="nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.k = 2  # type: ignore[misc]


def test_core_params_are_the_bound_struct_field_by_field():
    spec = DecodeSpec(n_predict=9, temperature=0.7, seed=2**63 + 5, spec=True, k=3, accept_rule="rejection",
                      stop_at_eos=False, record_margins=True, draft_p_min=0.25, draft_temperature=1.5,
                      record_pit=True, prefix_cache=False, prefix_limit=12, synthetic="rates:0.9/0.5/0.25",
                      draft_shape="tree:branches=2,p_split=0.2,budget=5")
    p = spec.core_params()
    assert isinstance(p, _core.GenerateParams)
    assert (p.n_predict, p.seed, p.spec, p.k, p.stop_at_eog, p.record_margins) == (9, 2**63 + 5, True, 3, False, True)
    assert p.temperature == pytest.approx(0.7) and p.draft_temperature == pytest.approx(1.5)
    assert p.rule == _core.AcceptRule.rejection and p.draft_p_min == pytest.approx(0.25)
    assert (p.record_pit, p.reuse_prompts, p.prefix_cache, p.prefix_limit) == (True, True, False, 12)
    assert p.drafter.type == "model" and p.drafter.options == {}
    assert p.synthetic == pytest.approx([0.9, 0.5 / 0.9, 0.25 / 0.5])  # kept given the earlier ones were
    assert p.tree.kind == _core.TreeKind.split and (p.tree.branches, p.tree.budget) == (2, 5)
    assert p.tree.p_split == pytest.approx(0.2)
    base = DecodeSpec(draft_shape="tree:topk=2,depth=2,budget=4").core_params()  # a baseline has no tree
    assert base.tree.kind == _core.TreeKind.none and base.prefix_limit == -1 and base.draft_temperature == 0.0
    assert DecodeSpec(spec=True, drafter="ngram-simple",
                      drafter_options={"--spec-ngram-simple-size-n": 3}).core_params().drafter.options == {
        "spec-ngram-simple-size-n": "3"}


def test_generate_under_a_spec_is_generate_with_its_fields(noisy_engine):
    fields = {"n_predict": 12, "spec": True, "k": 3, "temperature": 0.8, "seed": 5, "accept_rule": "rejection"}
    by_keywords = noisy_engine.generate(PROMPTS, **fields)
    by_spec = noisy_engine.generate(PROMPTS, DecodeSpec(**fields))
    by_name = noisy_engine.generate(PROMPTS, decode=DecodeSpec(**fields))
    for run in (by_spec, by_name):
        assert [t.tolist() for t in run.tokens] == [t.tolist() for t in by_keywords.tokens]
        assert run.totals["accepted"] == by_keywords.totals["accepted"]
        assert run.totals["drafted"] == by_keywords.totals["drafted"]
    # keywords beside a spec replace its fields
    greedy = noisy_engine.generate(PROMPTS, DecodeSpec(**fields), temperature=0.0)
    assert [t.tolist() for t in greedy.tokens] == [t.tolist() for t in noisy_engine.generate(
        PROMPTS, **{**fields, "temperature": 0.0}).tokens]


def test_generate_refuses_what_is_not_a_spec_before_decoding(noisy_engine):
    with pytest.raises(ValueError, match="DecodeSpec"):
        noisy_engine.generate(PROMPTS, {"n_predict": 4})
    with pytest.raises(TypeError, match="n_predicts"):
        noisy_engine.generate(PROMPTS, n_predicts=4)
    with pytest.raises(ValueError, match="k"):  # a field replaced beside a spec is checked too
        noisy_engine.generate(PROMPTS, DecodeSpec(spec=True), k="2")
