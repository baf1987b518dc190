"""No crying wolf: each example environment's scripted expert (`envs.EXPERTS`), rolled out
for a few batches through a real `Rollout`, gives the run doctor nothing to report."""
from __future__ import annotations

import pytest

from envs import EXPERTS
from tests.doctor_policies import expert, roll_steps
from workbench.debug.doctor import diagnose

#: Rollout settings per environment: arithmetic's expert calls the calculator inside
#: `env.step` (its own parser; through the function-calling parser the call never reaches
#: the environment and the expert would call it forever), and its JSON call needs room.
SETTINGS = {"arithmetic": {"own_parsing": True, "max_tokens": 96}, "grid": {"max_turns": 12},
            "text_game": {"max_turns": 8}, "wordle": {"max_turns": 8}}


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_expert_rollouts_give_no_findings(name, tiny_model_and_tokenizer):
    tok = tiny_model_and_tokenizer[1]
    batches = roll_steps(tok, name, [expert(name)] * 3, **SETTINGS.get(name, {}))
    assert all(e.success for b in batches for e in b), [e.turns[-1].observation for b in batches for e in b
                                                        if not e.success]
    assert diagnose(batches) == []
    assert diagnose(batches[0]) == []
