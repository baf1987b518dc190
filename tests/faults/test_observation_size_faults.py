"""A 10 MB observation (from `reset` or `step`) costs about what a short one does.

Each text used to be tokenized whole before the context check: one 10 MB observation made
a one-step run take over 4 minutes at 2.6 GB. Now `Rollout` judges a text by its length
first (`ChatRenderer.max_chars_per_token`): a first observation is cut with a note as
before (the cut search tokenizes only prefixes near the kept length), a later one ends
its episode as truncated ("context"), and one after the last turn is left out with a
warning. The environments are real `BaseEnvironment` subclasses; generation uses the
tiny test model; memory is measured with `tracemalloc` (the Python objects a whole
tokenization builds: 6 million ids for 10 MB of " word").
"""
from __future__ import annotations

import re
import time
import tracemalloc

import pytest

from envs import make_env
from tests.faults.test_rollout_faults import ROLLOUTS, assert_normal, run_bounded
from workbench.environments.base import BaseEnvironment
from workbench.rollout import check_token_alignment

MB = 10 * 2 ** 20
WORDS = MB // len(" word")  # 10 MB of text


class Flood(BaseEnvironment):
    """Say anything three times; `flood` ("reset" or "step") makes that observation 10 MB."""

    def reset(self) -> str:
        return "Say a number." + (" word" * WORDS if self.params.get("flood") == "reset" else "")

    def step(self, action: str):
        flood = self.params.get("flood") == "step"
        return "Again." + (" more" * WORDS if flood else ""), 1.0, self.step_count >= 3, {}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ten_megabyte_observations_finish_in_seconds_within_the_budget(tiny_engine, kind):
    budget = 2048
    tok = tiny_engine.tokenizer
    envs = [make_env("guess_number"), Flood({"max_steps": 5, "flood": "reset"}),
            Flood({"max_steps": 5, "flood": "step"}), Flood({"max_steps": 1, "flood": "step"}),
            make_env("guess_number")]
    rollout = ROLLOUTS[kind](tiny_engine, envs, seeds=[0, 1, 2, 3, 4], max_turns=3, max_tokens=16,
                             max_context_tokens=budget)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        batch = run_bounded(rollout, seconds=90)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Tokenizing one 10 MB text whole took ~45 s and built 6 million ids (>200 MB here).
    # What remains: the observations themselves and a few copies (the env's string, its
    # UTF-8 check).
    assert seconds < 30, f"{kind} rollout took {seconds:.1f} s"
    assert peak < 6 * MB, f"tracemalloc peak {peak / 2**20:.0f} MB"
    for ep in batch:
        assert ep.done and ep.error is None, (ep.episode_id, ep.error)
        assert ep.num_tokens <= budget, (ep.episode_id, ep.num_tokens)
        assert check_token_alignment(ep, tok).ok, check_token_alignment(ep, tok).message
    assert_normal(batch[0], tok)
    assert_normal(batch[4], tok)
    # 10 MB first observation: cut to fit with a note, the model still acts
    ep = batch[1]
    assert len(ep.warnings) == 1 and re.fullmatch(
        r"context: first observation cut from 10,485,773 to [\d,]+ characters \(opening prompt "
        r"10,48\d,\d{3} characters, over \d+ -> \d+ tokens\) to fit max_context_tokens=2048 with room "
        r"for a \d+-token turn", ep.warnings[0]), ep.warnings
    assert "[... observation cut: 10,485,773 characters" in ep.messages[1]["content"]
    assert ep.messages[1]["content"].startswith("Say a number. word word")
    assert ep.num_turns >= 1 and ep.response_length > 0
    assert 0 < len(ep.messages[1]["content"]) < 40_000
    # 10 MB later observation: the episode ends as truncated "context" before it is appended
    ep = batch[2]
    assert ep.truncated and ep.truncation_reason == "context" and ep.num_turns == 1, ep
    assert " more more" not in tok.decode(ep.token_ids)
    assert ep.turns[0].observation.startswith("Again. more more")  # kept with the turn
    # 10 MB observation after the last turn: left out, the turn closed, noted
    ep = batch[3]
    assert ep.num_turns == 1 and ep.turns[0].done and ep.truncation_reason == "max_steps"
    assert len(ep.warnings) == 1 and re.fullmatch(
        r"context: the observation after the last turn \(10,485,766 characters, over \d+ tokens\) was not "
        r"appended; it would pass max_context_tokens=2048", ep.warnings[0]), ep.warnings
    assert " more more" not in tok.decode(ep.token_ids)
    assert batch.meta["rollout/context_cuts"] == 1


@pytest.mark.parametrize("which", ["tiny", "embedded"])
def test_no_token_stands_for_more_characters_than_the_bound(which, tiny_model_path):
    """The length check refuses only what cannot fit: no token of the tiny model's or the
    embedded SmolLM2's vocabulary decodes to more than half the bound (SmolLM2 has an
    81-character token of newline + spaces), and the longest runs of the characters that
    make the longest tokens take more than len / bound tokens."""
    from workbench.models import embedded_model_path, load_tokenizer
    from workbench.rollout.chat import encode, max_chars_per_token

    tok = load_tokenizer(str(tiny_model_path) if which == "tiny" else str(embedded_model_path()))
    bound = max_chars_per_token(tok)
    longest = max(len(tok.decode([i], skip_special_tokens=False)) for i in range(len(tok)))
    assert 2 * longest <= bound <= 2 * max(longest, 4) + 16, (longest, bound)
    for text in (" " * 100_000, "\n" + " " * 100_000, "#" * 100_000, "word " * 20_000):
        assert len(encode(tok, text)) * bound >= 2 * len(text), text[:10]
