"""A TRL run opened by the workbench: TRL 1.16's GRPOTrainer trains the tiny model 3 steps on
CPU with log_completions=True, one reward function paying every completion alike (a planted
dead signal), while `WorkbenchCallback` writes a workbench run folder as it trains. Every view,
the doctor and `compare` (against a verl run written by verl's own code) read it."""
from __future__ import annotations

import json

import pytest

from tests.peer_writers import VERL_WRITER, run_peer, tree_digest
from tests.test_importers_verl import dump
from workbench.cli import main
from workbench.debug import compare_runs, diagnose, load_run

PROMPTS = [f"What is {i}+{i}?" for i in range(8)]


@pytest.fixture(scope="module")
def trl_run(tiny_model_path, tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.integrations.trl import WorkbenchCallback

    root = tmp_path_factory.mktemp("trl")
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])

    def flat(prompts, completions, **kwargs):  # pays every completion the same: groups teach nothing
        return [1.0 for _ in completions]

    def brevity(prompts, completions, **kwargs):  # a second reward function, so columns are told apart
        return [None if i % 2 else 0.0 for i, _ in enumerate(completions)]

    args = GRPOConfig(output_dir=str(root / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=12, max_steps=3, logging_steps=1, save_strategy="no", report_to="none",
                      use_cpu=True, log_completions=True, seed=0, dataloader_num_workers=0, beta=0.04,
                      shuffle_dataset=False)
    live = root / "live"
    seen = []

    class Follow(TrainerCallback):  # what load_run gives on the live folder while TRL trains
        def on_step_end(self, args, state, control, **kwargs):
            run = load_run(live)
            seen.append((state.global_step, run.steps, len(run.metrics)))

    trainer = GRPOTrainer(model=model, reward_funcs=[flat, brevity], args=args, train_dataset=data,
                          processing_class=tok, callbacks=[WorkbenchCallback(live, task="doubling"), Follow()])
    trainer.train()
    trainer.save_state()
    return {"out": root / "out", "live": live, "seen": seen}


def test_trls_own_files_open_as_a_run(trl_run):
    run = load_run(trl_run["out"])
    assert run.provenance.format == "trl" and run.steps == [0, 1, 2] and run.provenance.estimator == "grpo"
    batch = run.batch(0)
    assert len(batch) == 8 and len(set(batch.group_ids)) == 2
    ep = batch[0]
    assert ep.messages[0] == {"role": "user", "content": PROMPTS[0]} and ep.messages[1]["role"] == "assistant"
    assert ep.turns[0].action == ep.messages[1]["content"] and ep.score == 1.0
    info = ep.turns[0].info
    assert info["rewards"]["flat"] == 1.0 and "brevity" in info["rewards"] and info["advantage"] == 0.0
    assert "success" not in info and not ep.success  # TRL reports no success: none invented
    m = run.metrics.set_index("step")
    assert m.loc[1, "reward/mean"] == m.loc[1, "reward"] == 1.0 and m.loc[1, "source_step"] == 2
    assert m.loc[2, "actor/entropy"] == m.loc[2, "entropy"] and m.loc[0, "reward/zero_std_group_rate"] == 1.0


def test_the_callback_wrote_the_same_run_while_trl_trained(trl_run):
    live, after = load_run(trl_run["live"]), load_run(trl_run["out"])
    assert live.steps == after.steps == [0, 1, 2] and live.config.environment.name == "doubling"
    for step in live.steps:
        assert [e.to_dict() for e in live.batch(step)] == [e.to_dict() for e in after.batch(step)]
    assert list(live.metrics["reward/mean"]) == list(after.metrics["reward/mean"][:3])
    assert "written live" in " ".join(live.provenance.notes)
    # while TRL trained: each step's metrics at once, its batch one step behind (TRL writes it after on_log)
    assert trl_run["seen"] == [(1, [], 0), (2, [0], 1), (3, [0, 1], 2)]


def test_the_doctor_names_the_dead_signal_and_lists_what_it_could_not_check(trl_run, capsys):
    findings = diagnose(str(trl_run["out"]))
    flat = next(f for f in findings if f.name == "zero-variance-groups")
    assert flat.value == 1.0 and flat.step == 2 and flat.evidence[0].text == "group p0: all 4 rewards +1.000"
    assert findings.not_checked["reward-without-success"].startswith("TRL records no success signal")
    assert findings.not_checked["length-drift"].startswith("TRL records no token ids")
    assert "entropy-collapse" not in findings.not_checked and "kl-spike" not in findings.not_checked
    assert main(["diagnose", str(trl_run["out"])]) == 0
    out = capsys.readouterr().out
    assert "zero-variance-groups" in out and "try: python -m workbench train" not in out
    assert "not checked: tokenization-mismatch: TRL records no token alignment check" in out
    assert main(["diagnose", str(trl_run["out"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert [f["name"] for f in json.loads(captured.out)] == [f.name for f in findings]
    assert "not checked: length-drift" in captured.err


def test_every_view_opens_the_imported_run(trl_run):
    from workbench.widgets import ConversationView, FindingsPanel, RewardTuner, TokenView, TrainingDashboard
    from workbench.widgets.table import TrajectoryTable

    run = load_run(trl_run["out"])
    conv = ConversationView(run)
    assert PROMPTS[0] in conv.html or PROMPTS[4] in conv.html
    assert "success not reported" in conv.html and "recorded as text" in conv.html
    assert "advantage 0" in conv.html and "every score in its group is the same" in conv.html  # TRL's advantage
    table = TrajectoryTable(run, step=1)
    assert len(table.df) == 8
    dash = TrainingDashboard(run)
    assert dash.steps == 3
    with pytest.raises(ValueError, match="no tokens to show: TRL records no token ids; import with --model"):
        TokenView(run)
    tuner = RewardTuner(run, step=2)
    tuner.set_reward_fn(lambda ep: float(len(ep.turns[0].action)))  # a new reward_fn re-scores the episodes
    after = tuner.table["score_after"].tolist()
    assert after == [float(len(e.turns[0].action)) for e in run.batch(2)]
    assert tuner.table["score_before"].tolist() == [1.0] * 8 and tuner.table["adv_after"].abs().sum() > 0
    findings = diagnose(run)
    panel = FindingsPanel(findings, run)
    assert panel.pick(0) is not None


def test_compare_a_trl_run_with_a_verl_run(trl_run, tmp_path):
    verl = tmp_path / "verl"
    run_peer("verl", VERL_WRITER, {"dumps": [dump(s, str(verl / "rollout")) for s in range(3)]}, tmp_path)
    before = tree_digest(verl)
    cmp = compare_runs(verl, trl_run["out"])
    assert set(cmp.curves["run"]) == {"A", "B"} and len(cmp.curves[cmp.curves["run"] == "B"]) == 3
    assert any("imported from verl" in n and "records no environment" in n for n in cmp.notices)
    names = {c.name for c in cmp.findings["new"] + cmp.findings["persisting"]}
    assert "zero-variance-groups" in names
    assert any(n.startswith("the doctor could not check") and "length-drift (verl records no token ids" in n
               for n in cmp.notices)
    assert "# Run comparison" in cmp.to_markdown()
    assert tree_digest(verl) == before
    assert main(["compare", str(verl), str(trl_run["out"])]) == 0
