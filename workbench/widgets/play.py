"""`PlayWidget`: a person plays an environment turn by turn; the game is kept as a trajectory.

    play = PlayWidget(make_env("guess_number"), engine=engine, seed=0)
    display(play)
    play.send("8")                 # same as typing 8 and pressing Enter or clicking Send
    play.ask_model()               # fills the box with the model's suggestion
    play.batch                     # TrajectoryBatch with the played episode

Under the hood it is a one-environment `Rollout`: each typed action goes through
`rollout.step(human_actions={0: text})`, so it is tokenized, parsed, tool-called and
stepped exactly like a model action, and recorded as a human turn (loss mask 0:
never trained on). "Model plays" lets the model take the turn instead (mask 1),
so one episode can mix both.

From a recorded episode. `play.start_from(episode, turn=2, config=run_config)` rebuilds
that episode's first two turns on a fresh environment (replayed and checked as
`workbench.debug.fork` does: a `ReplayMismatch` if the environment answers differently)
and lets you play on from there.

Without a model. A rollout needs a tokenizer (to keep the token-exact record), not
a model. `engine=None` builds a `TokenizerOnlyEngine` around `tokenizer` (a
tokenizer object or a model name/path; default: the tiny test tokenizer); its
`generate_ids` raises, and the "Ask model"/"Model plays" buttons are disabled.
Use the tokenizer of the model you will train so the token counts are the real ones.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams
from workbench.rollout import Rollout
from workbench.rollout.configured import chat_settings
from workbench.trajectory import Episode, TrajectoryBatch
from workbench.widgets._html import STYLE, esc
from workbench.widgets.conversation import render_episode_html

__all__ = ["PlayWidget", "TokenizerOnlyEngine"]


class TokenizerOnlyEngine(GenerationEngine):
    """An engine with a tokenizer and no model: lets a `Rollout` record human play."""

    name = "none"

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        raise EngineError("this engine has no model (TokenizerOnlyEngine): only human actions can be played; "
                          "pass engine=HFEngine(model, tokenizer) to let a model act")


def _default_tokenizer(tokenizer: Any) -> Any:
    from workbench.models import build_tiny_model, load_tokenizer

    if tokenizer is None:
        return load_tokenizer(str(build_tiny_model()))
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer)
    return tokenizer


class PlayWidget(widgets.VBox):
    """Play an environment by hand (see the module docstring).

    Args:
        env: an environment instance or a registered name (`workbench.make_env`).
        engine: a generation engine for "Ask model"/"Model plays"; None = no model.
        tokenizer: used when `engine` is None (object or model name; default tiny tokenizer).
        seed: environment seed of the game.
        max_turns: turn limit (default: the environment's max_steps).
        config: a run's ConfigStore: its chat template settings (`inference.history`,
            `enable_thinking`, `tool_format`; `workbench.rollout.configured.chat_settings`)
            apply, so a game is rendered as the run renders its episodes.
        **rollout_kwargs: passed to `Rollout` (max_tokens, temperature, parser, tools, history, ...);
            they win over `config`'s.
    """

    observation = traitlets.Unicode("", help="latest observation from the environment")
    reward = traitlets.Float(0.0, help="reward of the last turn")
    total_reward = traitlets.Float(0.0, help="sum of rewards so far")
    done = traitlets.Bool(False, help="the episode has ended")
    turn = traitlets.Int(0, help="turns played")

    def __init__(self, env: Any, engine: GenerationEngine | None = None, tokenizer: Any = None, seed: int | None = 0,
                 max_turns: int | None = None, config: Any = None, **rollout_kwargs: Any):
        if isinstance(env, str):
            from workbench.environments.registry import make_env

            env = make_env(env)
        self.env = env
        self.has_model = engine is not None and not isinstance(engine, TokenizerOnlyEngine)
        self.engine = engine if engine is not None else TokenizerOnlyEngine(_default_tokenizer(tokenizer))
        self.seed = seed
        turns = max_turns or getattr(env, "max_steps", None) or 10
        if config is not None:
            rollout_kwargs = {**chat_settings(config), **rollout_kwargs}
        self.rollout = Rollout(self.engine, [env], seeds=[seed], max_turns=turns, **rollout_kwargs)
        self.message = ""

        self._header = widgets.HTML()
        self._transcript = widgets.HTML()
        self._transcript.add_class("wb-play-transcript")
        self._status = widgets.HTML()
        self._status.add_class("wb-play-status")
        self._text = widgets.Text(placeholder="your action, e.g. 8", layout=widgets.Layout(width="360px"))
        self._send_btn = widgets.Button(description="Send", button_style="primary", icon="paper-plane")
        self._ask = widgets.Button(description="Ask model", icon="lightbulb-o",
                                   tooltip="fill the box with the model's suggestion (you can edit it)")
        self._model_turn = widgets.Button(description="Model plays", icon="android",
                                          tooltip="let the model take this turn (trained on: mask 1)")
        self._new = widgets.Button(description="New game", icon="refresh")
        for b in (self._ask, self._model_turn):
            b.disabled = not self.has_model
            if not self.has_model:
                b.tooltip = "no model: pass engine=... to enable"
        controls = widgets.HBox([self._text, self._send_btn, self._ask, self._model_turn, self._new])
        super().__init__([self._header, self._transcript, self._status, controls])
        self.add_class("wb-play")
        self._send_btn.on_click(lambda _: self.send())
        self._text.on_msg(self._on_text_msg)  # Enter in the box sends, like the Send button
        self._ask.on_click(lambda _: self.ask_model())
        self._model_turn.on_click(lambda _: self.model_step())
        self._new.on_click(lambda _: self.reset())
        self.reset(seed)

    # -- actions -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> str:
        """Start a new game (same seed unless given); returns the first observation."""
        if seed is not None:
            self.seed = seed
            self.rollout.seeds = [seed]
        self.rollout.reset()
        self.message = ""
        self._text.value = ""
        self._sync()
        return self.observation

    def send(self, text: str | None = None) -> bool:
        """Play `text` (default: the text box) as a human turn; True if a turn was played."""
        text = (self._text.value if text is None else text).strip()
        if self.done:
            return self._say("the episode is over: click New game")
        if not text:
            return self._say("type an action first")
        try:
            self.rollout.step(human_actions={0: text})
        except Exception as exc:  # keep the widget alive; the error is shown
            return self._say(f"error: {type(exc).__name__}: {exc}")
        self.message = ""
        self._text.value = ""
        self._sync()
        return True

    def ask_model(self) -> str:
        """Fill the text box with the model's suggested action (not played until you Send)."""
        if not self.has_model:
            self._say("no model: pass engine=... to PlayWidget to ask one")
            return ""
        if self.done:
            self._say("the episode is over: click New game")
            return ""
        try:
            suggestion = self.rollout.suggest(0)
        except Exception as exc:
            self._say(f"error: {type(exc).__name__}: {exc}")
            return ""
        self._text.value = suggestion
        self._say("model suggestion in the box: edit it or click Send (sent text counts as a human turn)")
        return suggestion

    def model_step(self) -> bool:
        """Let the model play this turn (a sampled, trained-on turn)."""
        if not self.has_model or self.done:
            return self._say("no model" if not self.has_model else "the episode is over: click New game")
        try:
            self.rollout.step()
        except Exception as exc:
            return self._say(f"error: {type(exc).__name__}: {exc}")
        self.message = ""
        self._sync()
        return True

    def start_from(self, episode: Episode, turn: int, config: Any = None, environment: Any = None,
                   **options: Any) -> str:
        """Continue a recorded `episode` from `turn`: its first `turn` turns are replayed on a
        fresh environment (`workbench.rollout.fork.replay`: recorded ids, checked against the
        record) and the game goes on from there. The environment comes from `environment`
        (a prototype or factory), else the run's `config.environment`, else a copy of this
        widget's; the limits from `config`, else this widget's; parser and tools are the
        widget's unless given in `options`. Returns the observation now
        shown. Raises `ReplayMismatch` when the replay differs (nothing changes then)."""
        from workbench.rollout.fork import replay

        r = self.rollout
        options = {"parser": r.parser, "tools": r.tools, **options}  # the widget's parser and tools
        if config is None:
            options = {"max_turns": r.max_turns, **r.sampling, "max_context_tokens": r.max_context_tokens, **options}
        if environment is None and config is None:
            environment = self.env
        self.rollout = replay(episode, turn, self.engine, n=1, config=config, environment=environment, **options)
        self.env = self.rollout.environments[0]
        self.seed = episode.env_seed
        self.message = f"replayed episode {episode.episode_id} up to turn {turn}: your move"
        self._text.value = ""
        self._sync()
        self._status.value = self._status_html()
        return self.observation

    # -- results ---------------------------------------------------------------------------
    @property
    def episode(self) -> Episode:
        """The episode being played (updated in place)."""
        return self.rollout.slots[0].episode

    trajectory = episode

    @property
    def batch(self) -> TrajectoryBatch:
        """The played episode as a one-episode batch (collated now)."""
        return self.rollout.batch

    @property
    def html(self) -> str:
        """Everything the widget shows as HTML (header, transcript, status)."""
        return self._header.value + self._transcript.value + self._status.value

    # -- internals -----------------------------------------------------------------------------
    def _on_text_msg(self, widget: Any, content: Any, buffers: Any = None) -> None:
        """The text box's frontend sends {"event": "submit"} when Enter is pressed."""
        if isinstance(content, dict) and content.get("event") == "submit":
            self.send()

    def _say(self, message: str) -> bool:
        self.message = message
        self._status.value = self._status_html()
        return False

    def _sync(self) -> None:
        ep = self.episode
        last = ep.turns[-1] if ep.turns else None
        with self.hold_trait_notifications():
            self.turn = ep.num_turns
            self.done = ep.done
            self.reward = last.reward if last else 0.0
            self.total_reward = ep.total_reward
            self.observation = (last.observation if last else (ep.states[0] if ep.states else ""))
        name = getattr(self.env, "NAME", None) or type(self.env).__name__
        model = f"model: {self.engine.name}" if self.has_model else "no model (human play only)"
        self._header.value = (f'{STYLE}<div class="wb-root wb-head"><b>Playing {esc(name)}</b> · seed {self.seed} · '
                              f'{model} · your turns are recorded with loss mask 0</div>')
        self._transcript.value = render_episode_html(ep, show_system=True)
        self._status.value = self._status_html()
        self._send_btn.disabled = self.done
        self._text.disabled = self.done
        self._ask.disabled = self._model_turn.disabled = self.done or not self.has_model

    def _status_html(self) -> str:
        state = "<b>done</b>" + (" · success" if self.episode.success else "") if self.done else "your move"
        kind = "wb-errline" if self.message.startswith(("error", "no model", "the episode is over", "type")) else "wb-legend"
        msg = f'<div class="{kind}">{esc(self.message)}</div>' if self.message else ""
        return (f'<div class="wb-root wb-end"><div><b>observation:</b> {esc(self.observation)}</div>'
                f'<div>turn {self.turn} · last reward {self.reward:+.3g} · total {self.total_reward:+.3g} · '
                f'{state}</div>{msg}</div>')

    def __repr__(self) -> str:
        return (f"PlayWidget(env={type(self.env).__name__}, seed={self.seed}, turns={self.turn}, "
                f"total_reward={self.total_reward:.3g}, done={self.done}, model={self.has_model})")
