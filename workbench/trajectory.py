"""The trajectory batch: the one contract between rollout and learning.

An `Episode` (alias `Trajectory`, the seeds' name) is one conversation with an
environment, stored token by token exactly as the model saw and sampled it:

    token_ids[i]         the token
    loss_mask[i]         1 if the policy sampled it (trained on), 0 for prompt,
                         observation, tool result, template glue and human turns
    rollout_logprobs[i]  the sampling engine's raw logprob for sampled tokens, else 0
    turn_index[i]        which turn the token belongs to (-1 = initial prompt)

plus one `Turn` per agent step (action text, observation, reward, tool calls,
errors) and the seeds' per-step lists `states`, `actions`, `rewards`, `dones`.

An episode is one token sequence, except where a turn was sampled from a prompt that
does not extend the ids before it ("rendered" history: each turn's prompt is the chat
template's render of the conversation so far). Then `segments` says where each new
sequence starts and how much of the previous one it shares; `positions()` gives every
token's position in its own sequence, and the training forward lets a token attend only
to its own sequence (`position_ids`).

A `TrajectoryBatch` holds episodes and, once collated, right-padded (B, T) tensors.
Tensor fields are declared once in `TOKEN_FIELDS` with their meaning; collation,
`.to(device)`, saving and per-token views loop over that table, never over a
hand-copied list of keys. Later stages (scoring, advantages, update) fill in more
of the fields; `batch.require("advantages")` says which stage produces a missing one.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from workbench.trajectory_files import (  # noqa: F401 - importable from here too
    MAX_LINE_BYTES, MAX_LOAD_BYTES, BatchTooLarge, NotABatchFile, jsonable, read_records, write_records,
)
from workbench.trajectory_views import batch_frame, batch_html

#: Per-token (B, T) tensor fields: name -> (dtype, meaning, stage that fills it).
TOKEN_FIELDS: dict[str, tuple[torch.dtype, str, str]] = {
    "input_ids": (torch.long, "token ids of the whole episode", "collate"),
    "attention_mask": (torch.long, "1 for real tokens, 0 for right padding", "collate"),
    "position_ids": (torch.long, "position of each token in its own sequence; only in batches where some episode "
                     "holds several sequences (`Episode.segments`)", "collate"),
    "loss_mask": (torch.float32, "1 for policy-sampled tokens (the response mask)", "collate"),
    "rollout_logprobs": (torch.float32, "sampling engine's logprob of each sampled token", "collate"),
    "old_logprobs": (torch.float32, "policy logprob recomputed before the update", "trainer.compute_logprobs"),
    "ref_logprobs": (torch.float32, "reference-policy logprob", "trainer.compute_logprobs"),
    "values": (torch.float32, "critic value estimate per token", "trainer.compute_values"),
    "token_level_scores": (torch.float32, "rewards placed on tokens before any KL penalty", "trainer.score"),
    "token_level_rewards": (torch.float32, "rewards after the KL penalty (if used)", "trainer.score"),
    "kl": (torch.float32, "per-token KL estimate policy vs reference", "trainer.compute_advantages"),
    "advantages": (torch.float32, "per-token advantage", "trainer.compute_advantages"),
    "returns": (torch.float32, "per-token return target", "trainer.compute_advantages"),
    "new_logprobs": (torch.float32, "policy logprob during the last update pass", "trainer.update"),
    "ratio": (torch.float32, "exp(new - old) importance ratio in the last update", "trainer.update"),
    "rollout_is_weights": (torch.float32, "truncated pi_old / pi_rollout weight of each trained token "
                           "(training.rollout_is)", "trainer.update"),
    "entropy": (torch.float32, "policy entropy per token in the last update", "trainer.update"),
    "diff_logprobs_a": (torch.float32, "logprob of each trained token under policy A", "debug.compare_policies"),
    "diff_logprobs_b": (torch.float32, "logprob of each trained token under policy B", "debug.compare_policies"),
    "diff_delta": (torch.float32, "logprob under B minus under A (trained tokens)", "debug.compare_policies"),
    "diff_kl": (torch.float32, "per-token KL(B || A) estimate (k3) on trained tokens", "debug.compare_policies"),
    "recomputed_logprobs": (torch.float32, "logprob of each trained token under a model, recomputed by teacher "
                            "forcing for a run imported as text (not sampled)", "importers.recompute"),
    "recomputed_entropy": (torch.float32, "that model's entropy at each trained token (recomputed, not sampled)",
                           "importers.recompute"),
    "recomputed_kl": (torch.float32, "KL(model || ref model) of the next-token distributions at each trained "
                      "token (recomputed, not sampled)", "importers.recompute"),
}
COLLATED = ("input_ids", "attention_mask", "loss_mask", "rollout_logprobs")
#: Collated too, only when some episode holds several sequences (`Episode.segments`).
SEQUENCE_FIELDS = ("position_ids",)

@dataclass
class Turn:
    """One agent step: an action (model or human) and what came back."""

    index: int = 0
    """0-based turn number within the episode."""
    action: str = ""
    """The acting text (decoded sampled ids for model turns)."""
    source: str = "model"
    """"model" (sampled, trained on), "human" (typed, never trained on) or "edited" (typed in
    place of a recorded turn when the episode was forked, `workbench.rollout.fork`; never
    trained on)."""
    observation: str = ""
    """Text returned to the model (environment observation or tool results)."""
    reward: float = 0.0
    """Environment reward earned by this turn."""
    done: bool = False
    """Whether the episode ended after this turn."""
    info: dict[str, Any] = field(default_factory=dict)
    """Environment info (success, invalid_action, truncated, ...)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls made in this turn: {"name", "arguments", "success", "result"}."""
    parse_error: str | None = None
    """Why the action could not be parsed, if it could not: the parser's error, or the
    environment's format error (`info["parse_error"]`, e.g. a strict-format refusal)."""
    env_error: str | None = None
    """Exception raised by the environment's step, if any (ends the episode)."""
    token_start: int = 0
    """Index of this turn's first action token in `Episode.token_ids`."""
    token_end: int = 0
    """One past this turn's last action token."""
    finish_reason: str = "stop"
    """"stop", "length" (hit max_tokens), "human" or "error"; "unknown" in a run imported from a
    trainer that does not record it (`workbench.importers`)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Non-model chat messages appended after this turn."""
    constraint: dict[str, Any] | None = None
    """The grammar a model turn was sampled under (`Constraint.to_dict()` of
    `workbench.engines.constraints`, plus the call's `stop_token_ids`), or None: free. Its
    logprobs are of the masked distribution, and the trainer masks alike."""
    reasoning_tokens: int = 0
    """Tokens of the action inside its reasoning block (`<think>`...`</think>`, markers
    included); 0 for a reply without one. The action was read from the text after it."""
    reasoning_cut: bool = False
    """The reply ended inside its reasoning block (no end marker), so it had no action."""


@dataclass
class Episode:
    """One conversation with an environment, token-exact (see module docstring)."""

    episode_id: int = 0
    """Position of the episode in its rollout."""
    group_id: str = ""
    """Episodes with the same group id started from the same environment seed (GRPO group)."""
    env_name: str = ""
    """Environment class name."""
    env_seed: int | None = None
    """Seed passed to the environment's reset."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation: system, user (first observation), assistant, tool/user, ..."""
    token_ids: list[int] = field(default_factory=list)
    """All tokens of the episode in order."""
    loss_mask: list[int] = field(default_factory=list)
    """1 for policy-sampled tokens, else 0."""
    rollout_logprobs: list[float] = field(default_factory=list)
    """Sampling logprob of sampled tokens, 0.0 elsewhere."""
    turn_index: list[int] = field(default_factory=list)
    """Turn each token belongs to; -1 for the initial prompt."""
    prompt_length: int = 0
    """Tokens before the first action."""
    turns: list[Turn] = field(default_factory=list)
    """One entry per agent step."""
    states: list[str] = field(default_factory=list)
    """Observation before each step (seed API)."""
    actions: list[str] = field(default_factory=list)
    """Action text of each step (seed API)."""
    rewards: list[float] = field(default_factory=list)
    """Environment reward of each step (seed API)."""
    dones: list[bool] = field(default_factory=list)
    """Done flag after each step (seed API)."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    """Info dict of each step."""
    done: bool = False
    """The episode has ended (environment done, truncation or error)."""
    success: bool = False
    """The environment reported info["success"] on some step."""
    success_reported: bool | None = None
    """The environment reports success at all (`BaseEnvironment.reports_success` True, set by
    the rollout); None: judged by the infos (a "success" key on some step). See
    `success_reported`."""
    truncated: bool = False
    """Ended by a limit rather than by the environment."""
    truncation_reason: str | None = None
    """"max_turns", "max_steps" or "context" when truncated."""
    error: str | None = None
    """Error that ended the episode (environment crash, engine failure), if any."""
    weight_version: int | None = None
    """Version of the policy weights this episode was sampled with (the trainer step after
    which they were pushed; set by Ray rollout workers)."""
    warnings: list[str] = field(default_factory=list)
    """Problems found (e.g. token misalignment), kept with the episode."""
    score: float | None = None
    """Outcome reward from the reward function (set by scoring)."""
    judgments: list[dict[str, Any]] = field(default_factory=list)
    """What each reward model said of this episode (set by scoring when `reward.judge`,
    `reward.group_judge` or `reward.reward_model` is on; `workbench.reward.judgments.Judgment`):
    source, model, score (on 0..1, None when it failed), raw score, reason, the exact judge
    prompt, error, seconds, tokens, cached."""
    env_score: float | None = None
    """The environment's score (shaped rewards or the reward function's) before the model
    rewards were added to it; None when no model reward is on (then `score` is it)."""
    reward_error: str | None = None
    """Why the episode could not be scored (a judgment that timed out, gave no score or one out
    of range): the update leaves it out (`TrajectoryBatch.untrained_rows`) and the count is
    `reward/judge_failed`; never a reward of 0 in its place."""
    forked_from: dict[str, Any] | None = None
    """Where this episode branches off a recorded one (`workbench.rollout.fork`): episode_id,
    group_id, env_seed, turn, token_position (tokens before it equal the original's), edit
    ("action", "observation" or None for a resample), text, original_outcome; None otherwise."""
    history: str = "sampled"
    """How the model saw its earlier turns (`inference.history`): "sampled" (every turn's prompt
    is the episode's ids so far: earlier turns as sampled, the text around them rendered) or
    "rendered" (every turn's prompt is the chat template's render of the conversation so far;
    a prompt that does not extend the ids before it starts a new sequence, see `segments`)."""
    segments: list[list[int]] = field(default_factory=list)
    """`[start, shared]` per token sequence after the first, in order: the tokens from flat
    position `start` (to the next segment's start) follow the first `shared` tokens of the
    sequence before, not the tokens just before them. Empty: the episode is one sequence."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Template variables the episode's chat template was rendered with (e.g. `enable_thinking`,
    `tools`); the alignment check renders with them."""

    # -- derived --------------------------------------------------------------
    @property
    def total_reward(self) -> float:
        """Sum of environment rewards."""
        return float(sum(self.rewards))

    @property
    def outcome(self) -> float:
        """The episode's outcome reward: `score` once scored (`workbench.reward.score_batch`),
        else the summed environment rewards. Every summary, table and sort uses this."""
        return float(self.score) if self.score is not None else self.total_reward

    @property
    def environment(self) -> Any:
        """The environment instance that played this episode (the rollout's own per-episode
        copy, in the state the episode left it), or None (episodes built by hand, loaded
        from a file, unpickled or deep-copied). Not a field: `to_dict`/`save` and pickling
        leave it out, so batches save and travel between processes as before."""
        return self.__dict__.get("_environment")

    @environment.setter
    def environment(self, env: Any) -> None:
        self.__dict__["_environment"] = env

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_environment", None)
        return state

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def response_length(self) -> int:
        """Number of policy-sampled tokens."""
        return int(sum(self.loss_mask))

    @property
    def environment_error(self) -> str | None:
        """What the environment raised when the episode ended in an environment error (a turn's
        `env_error`, a reset or a step that raised or overran its timeout), else None. Its reward
        says nothing about the policy, so the update leaves the episode out (`untrained_rows`)."""
        for turn in self.turns:
            if turn.env_error:
                return turn.env_error
        if self.error and self.error.startswith("environment "):
            return self.error.split(": ", 1)[-1] if self.error.startswith("environment error: ") else self.error
        return None

    @property
    def recorded_as_text(self) -> bool:
        """Model turns recorded without their token ids: an episode imported from a trainer that
        kept only the text (`workbench.importers`). Its trainer trained on it, so it counts as
        trained (`TrajectoryBatch.untrained_rows`) though it has no token to show."""
        return not self.token_ids and any(t.source == "model" for t in self.turns)

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    # -- sequences (see `segments`) -------------------------------------------------
    def _chains(self) -> list[list[int]]:
        """Flat positions of each sequence, from its first token to its last, in order."""
        chains: list[list[int]] = []
        bounds = [[0, 0], *self.segments, [self.num_tokens, 0]]
        for (start, shared), (end, _) in zip(bounds, bounds[1:]):
            prefix = chains[-1][:shared] if chains else []
            chains.append(prefix + list(range(start, end)))
        return chains

    def positions(self) -> list[int]:
        """Each token's position in its own sequence (0, 1, 2, ... for a one-sequence episode)."""
        if not self.segments:
            return list(range(self.num_tokens))
        out: list[int] = []
        bounds = [[0, 0], *self.segments, [self.num_tokens, 0]]
        for (start, shared), (end, _) in zip(bounds, bounds[1:]):
            out.extend(range(shared, shared + end - start))
        return out

    def sequence_indices(self, end: int | None = None) -> list[int]:
        """Flat positions of the sequence a token at flat position `end` follows (its context;
        default: the context of a token appended after the last one)."""
        end = self.num_tokens if end is None else end
        bounds = [[0, 0], *self.segments]
        chain: list[int] = []
        for s, (start, shared) in enumerate(bounds):
            nxt = bounds[s + 1][0] if s + 1 < len(bounds) else None
            if nxt is not None and nxt <= end:  # the token at `end` lies in a later sequence
                chain = chain[:shared] + list(range(start, nxt))
                continue
            return chain[:shared] + list(range(start, end))
        return chain

    def context_ids(self) -> list[int]:
        """The ids the next turn is sampled after: the last sequence (for a one-sequence
        episode `token_ids` itself, not a copy)."""
        if not self.segments:
            return self.token_ids
        return [self.token_ids[p] for p in self._chains()[-1]]

    @property
    def context_length(self) -> int:
        """Tokens of the last sequence (what `max_context_tokens` bounds)."""
        if not self.segments:
            return self.num_tokens
        start, shared = self.segments[-1]
        return shared + self.num_tokens - start

    def start_sequence(self, shared: int) -> None:
        """The tokens appended next start a new sequence after the first `shared` tokens of the
        current one (nothing is recorded when `shared` is all of it: they simply follow)."""
        if not 0 <= shared <= self.context_length:
            raise ValueError(f"shared must be in 0..{self.context_length}, got {shared}")
        if shared < self.context_length:
            if self.segments and self.segments[-1][0] == self.num_tokens:  # replaces an empty sequence
                self.segments.pop()
            self.segments.append([self.num_tokens, shared])

    def truncate_tokens(self, n: int) -> None:
        """Keep the first `n` tokens (with their mask, logprobs, turn index and sequences)."""
        for name in ("token_ids", "loss_mask", "rollout_logprobs", "turn_index"):
            del getattr(self, name)[n:]
        self.segments = [s for s in self.segments if s[0] < n]
        self.prompt_length = min(self.prompt_length, n)

    def append_tokens(self, ids: list[int], trained: bool, logprobs: list[float] | None, turn: int) -> None:
        """Append ids with their mask, logprobs and turn index (keeps the lists aligned)."""
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} logprobs")
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
        self.rollout_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turn_index.extend([turn] * len(ids))

    def render(self, tokenizer: Any, trained_marker: tuple[str, str] = ("[[", "]]")) -> str:
        """Decoded text with policy-trained spans wrapped in markers (default [[...]])."""
        out, i = [], 0
        n = len(self.token_ids)
        while i < n:
            j = i
            while j < n and self.loss_mask[j] == self.loss_mask[i]:
                j += 1
            text = tokenizer.decode(self.token_ids[i:j], skip_special_tokens=False)
            out.append(f"{trained_marker[0]}{text}{trained_marker[1]}" if self.loss_mask[i] else text)
            i = j
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        """The episode as plain data (what `dataclasses.asdict` gives; the per-token lists, which
        hold numbers by contract, are copied without visiting each number)."""
        out = {}
        for f in _EPISODE_FIELDS:
            value = getattr(self, f)
            out[f] = list(value) if f in _TOKEN_LISTS else _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Episode":
        data = dict(data)
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        data["segments"] = [list(s) for s in data.get("segments", [])]
        return cls(**data)

    def __repr__(self) -> str:
        return (f"Episode(id={self.episode_id}, env={self.env_name}, seed={self.env_seed}, "
                f"turns={self.num_turns}, tokens={self.num_tokens}, trained={self.response_length}, "
                f"reward={self.total_reward:.3g}, success={self.success}, done={self.done}"
                + (f", truncated={self.truncation_reason}" if self.truncated else "")
                + (f", error={self.error!r}" if self.error else "") + ")")


#: The seeds' name for an episode.
Trajectory = Episode
_EPISODE_FIELDS = tuple(f.name for f in fields(Episode))
#: Episode fields that hold one number per token.
_TOKEN_LISTS = frozenset({"token_ids", "loss_mask", "rollout_logprobs", "turn_index"})
_SCALARS = (int, float, str, bool, type(None))


def _plain(value: Any) -> Any:
    """A copy of `value` as `dataclasses.asdict` makes it (dataclasses as dicts, containers
    copied, other values deep-copied), without deep-copying the numbers and strings."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [_plain(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return copy.deepcopy(value)


def success_reported(episodes: Any) -> bool:
    """Whether the environment of these episodes reports success at all: it says it does
    (`Episode.success_reported`, from `BaseEnvironment.reports_success`), some episode
    succeeded, or some step's info carries a "success" key (True or False). One that never
    does (a judge-graded task, a Gym env without `is_success`, a run imported from a trainer
    that records none) has no success rate: `env/success_rate` is NaN, shown "-", and the
    doctor's success checks leave it out, instead of a false 0.00. Where it does, episodes
    whose steps never mentioned it count as not successful."""
    return any(e.success_reported or e.success or any("success" in t.info for t in e.turns) for e in episodes)


def format_rate(value: Any, spec: str = ".2f") -> str:
    """A rate for a line people read: `format(value, spec)`, or "-" when it is not known
    (None or NaN: e.g. the success rate of an environment that does not report success)."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec)


class TrajectoryBatch:
    """Episodes plus their per-token tensors (see `TOKEN_FIELDS`)."""

    def __init__(self, episodes: list[Episode], tensors: dict[str, torch.Tensor] | None = None):
        self.episodes = list(episodes)
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.meta: dict[str, Any] = {}
        if not self.tensors and self.episodes:
            self.collate()

    # -- tensors --------------------------------------------------------------
    def collate(self) -> "TrajectoryBatch":
        """Build the (B, T) right-padded tensors from the episodes' token lists."""
        B = len(self.episodes)
        T = max((e.num_tokens for e in self.episodes), default=0)
        trees = any(e.segments for e in self.episodes)  # some episode holds several sequences
        self.tensors.pop("position_ids", None)
        for name in COLLATED + (SEQUENCE_FIELDS if trees else ()):
            dtype = TOKEN_FIELDS[name][0]
            self.tensors[name] = torch.zeros((B, T), dtype=dtype)  # (B, T)
        for b, ep in enumerate(self.episodes):
            n = ep.num_tokens
            self.tensors["input_ids"][b, :n] = torch.tensor(ep.token_ids, dtype=torch.long)
            self.tensors["attention_mask"][b, :n] = 1
            self.tensors["loss_mask"][b, :n] = torch.tensor(ep.loss_mask, dtype=torch.float32)
            self.tensors["rollout_logprobs"][b, :n] = torch.tensor(ep.rollout_logprobs, dtype=torch.float32)
            if trees:
                self.tensors["position_ids"][b, :n] = torch.tensor(ep.positions(), dtype=torch.long)
        return self

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in TOKEN_FIELDS:
            tensors = self.__dict__.get("tensors", {})
            if name in tensors:
                return tensors[name]
            raise AttributeError(
                f"batch.{name} is not computed yet; it is filled by {TOKEN_FIELDS[name][2]}()"
            )
        raise AttributeError(name)

    def require(self, *names: str) -> None:
        """Raise a clear error naming the stage that fills any missing field."""
        for name in names:
            if name not in self.tensors:
                raise ValueError(f"batch.{name} is missing: run {TOKEN_FIELDS[name][2]}() first")

    def set(self, name: str, value: torch.Tensor) -> None:
        """Store a (B, T) field after checking its name and shape."""
        if name not in TOKEN_FIELDS:
            raise KeyError(f"unknown token field {name!r}; known: {list(TOKEN_FIELDS)}")
        expected = tuple(self.tensors["input_ids"].shape)
        if tuple(value.shape) != expected:
            raise ValueError(f"batch.{name} must have shape {expected}, got {tuple(value.shape)}")
        self.tensors[name] = value

    def has(self, name: str) -> bool:
        return name in self.tensors

    def to(self, device: str | torch.device) -> "TrajectoryBatch":
        """Move every tensor field to `device` (in place; returns self)."""
        self.tensors = {k: v.to(device) for k, v in self.tensors.items()}
        return self

    def engine_logprob_gap(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(|old_logprobs - rollout_logprobs| (B, T), mask (B, T)): how far the trainer's
        logprobs are from the sampling engine's, over the trained tokens the engine gave a
        logprob for (`rollout_logprobs` is 0 where it gave none). None without both fields."""
        if not (self.has("old_logprobs") and self.has("rollout_logprobs")):
            return None
        rollout = self.tensors["rollout_logprobs"]  # (B, T)
        mask = self.tensors["loss_mask"].bool() & (rollout != 0)  # (B, T)
        return (self.tensors["old_logprobs"] - rollout).abs() * mask, mask

    def token_values(self, index: int, name: str) -> list[float]:
        """Per-token values of one episode (unpadded), e.g. token_values(0, "advantages")."""
        self.require(name)
        n = self.episodes[index].num_tokens
        return self.tensors[name][index, :n].detach().float().cpu().tolist()

    # -- container protocol --------------------------------------------------------
    def __len__(self) -> int:
        return len(self.episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self.episodes)

    def __getitem__(self, index: int) -> Episode:
        return self.episodes[index]

    def select(self, indices: list[int]) -> "TrajectoryBatch":
        """A sub-batch with the given episodes and the matching tensor rows."""
        idx = torch.tensor(indices, dtype=torch.long)
        sub = TrajectoryBatch([self.episodes[i] for i in indices], {})
        T = max((self.episodes[i].num_tokens for i in indices), default=0)
        sub.tensors = {k: v.index_select(0, idx.to(v.device))[:, :T] for k, v in self.tensors.items()}
        sub.meta = dict(self.meta)
        return sub

    @property
    def group_ids(self) -> list[str]:
        return [e.group_id for e in self.episodes]

    def group_rows(self) -> dict[str, list[int]]:
        """Rows of each group (episodes sharing a `group_id`), in order of first appearance."""
        rows: dict[str, list[int]] = {}
        for i, e in enumerate(self.episodes):
            rows.setdefault(e.group_id, []).append(i)
        return rows

    def trained_outcomes(self, rows: list[int]) -> list[float]:
        """The outcomes of the episodes among `rows` that have a trained token (or were
        `recorded_as_text`) and a score (an episode whose judgment failed, `Episode.reward_error`,
        has none)."""
        return [self.episodes[i].outcome for i in rows
                if (self.episodes[i].response_length or self.episodes[i].recorded_as_text)
                and not self.episodes[i].reward_error]

    def untrained_rows(self) -> list[int]:
        """Rows the update leaves out: episodes without a single trained (policy-sampled)
        token (every episode whose `reset` raised, or whose agent never called the model; an
        imported episode `recorded_as_text` is not one of them), episodes that ended in an
        environment error (`Episode.environment_error`: their reward is the environment's
        failure, not the policy's), and episodes that could not be scored
        (`Episode.reward_error`: a failed judgment). No loss counts them, and they are no
        member of their group's baseline (`update_group_ids`)."""
        return [i for i, e in enumerate(self.episodes)
                if (e.response_length == 0 and not e.recorded_as_text) or e.environment_error or e.reward_error]

    def update_group_ids(self) -> list[str]:
        """`group_ids` as the advantage estimators see them: an episode without a trained
        token is a group of its own, so a failed episode's 0 reward does not move the
        baseline of the episodes that ran (its advantages are 0 either way)."""
        untrained = set(self.untrained_rows())
        return [f"{e.group_id}/untrained{i}" if i in untrained else e.group_id for i, e in enumerate(self.episodes)]

    # -- summaries ------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        """Batch-level numbers with fixed names (the dashboard reads these). The reward numbers
        are over the episodes that have a score (not those whose judgment failed,
        `Episode.reward_error`)."""
        eps = self.episodes
        n = max(len(eps), 1)
        rewards = [e.outcome for e in eps if not e.reward_error]
        model_turns = [t for e in eps for t in e.turns if t.source == "model"]
        mean = sum(rewards) / max(len(rewards), 1)
        std = (sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)) ** 0.5
        return {
            **self.group_stats(),
            "episodes": float(len(eps)),
            "reward/mean": mean,
            "reward/std": std,
            "reward/max": max(rewards, default=0.0),
            "reward/min": min(rewards, default=0.0),
            "env/success_rate": sum(e.success for e in eps) / n if success_reported(eps) else float("nan"),
            "env/turns_mean": sum(e.num_turns for e in eps) / n,
            "env/truncated_rate": sum(e.truncated for e in eps) / n,
            "env/error_rate": sum(e.error is not None for e in eps) / n,
            "env/environment_error_rate": sum(e.environment_error is not None for e in eps) / n,
            "env/tool_calls_mean": sum(e.num_tool_calls for e in eps) / n,
            "env/parse_error_rate": sum(1 for e in eps for t in e.turns if t.parse_error) / max(1, sum(e.num_turns for e in eps)),
            "rollout/response_length_mean": sum(e.response_length for e in eps) / n,
            "rollout/failed_episodes": float(len(self.untrained_rows())),
            "rollout/tokens_mean": sum(e.num_tokens for e in eps) / n,
            "rollout/reasoning_tokens_mean": sum(t.reasoning_tokens for t in model_turns) / max(1, len(model_turns)),
            "rollout/reasoning_cut_rate": sum(t.reasoning_cut for t in model_turns) / max(1, len(model_turns)),
        }

    def group_stats(self) -> dict[str, float]:
        """How many groups (episodes sharing a `group_id`) give a group-relative estimator
        (GRPO, RLOO) nothing to learn from: all rewards in the group equal, so every
        advantage is 0. `reward/zero_std_group_rate` is their fraction (1.0 = a no-op step)."""
        # An episode with nothing trained is no member of its group (untrained_rows).
        groups = [rs for rs in map(self.trained_outcomes, self.group_rows().values()) if rs]
        flat = sum(1 for rs in groups if len(rs) > 1 and max(rs) == min(rs))
        return {"reward/groups": float(len(groups)),
                "reward/zero_std_group_rate": flat / max(len(groups), 1)}

    def to_pandas(self, level: str = "episode"):
        """A DataFrame with one row per "episode", "turn" or "token"."""
        return batch_frame(self, level, [k for k in TOKEN_FIELDS if k in self.tensors])

    # -- persistence ----------------------------------------------------------------
    def save(self, path: str | Path, compresslevel: int = 9) -> Path:
        """Write as JSONL: a header line, then one line per episode with its token fields.

        Floats go through Python's shortest round-trip repr, so `load` restores
        every tensor bit for bit. A path ending in ".gz" is written gzip-compressed.
        The file is written beside the target and renamed into place, so a reader
        never sees half of it (and a failed save leaves no file behind). Values JSON has
        no type for (numpy arrays and scalars, tensors, sets in a turn's `info`) are
        written as what `jsonable` makes of them: lists and numbers, else their repr.
        `compresslevel` is gzip's (1 fastest .. 9 smallest, the default).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        extra = [k for k in self.tensors if k not in COLLATED + SEQUENCE_FIELDS]  # those: rebuilt by collate
        records = ({**ep.to_dict(), "_fields": {k: self.token_values(b, k) for k in extra}}
                   for b, ep in enumerate(self.episodes))
        write_records(path, {"format": "workbench.trajectory_batch", "version": 1, "fields": extra,
                             "meta": self.meta}, records, compresslevel)
        return path

    @classmethod
    def load(cls, path: str | Path, max_bytes: int | None = None,
             max_line_bytes: int | None = None) -> "TrajectoryBatch":
        """Read a file written by `save` (gzip when the name ends in ".gz").

        The file is streamed line by line and its decompressed size counted, so a file
        that decompresses to far more than any batch (a gzip bomb, a wrong file) is
        refused before it fills memory: more than `max_bytes` in all (default
        `MAX_LOAD_BYTES`, 2 GiB) or one line longer than `max_line_bytes` (default
        `MAX_LINE_BYTES`, 256 MiB; one line holds one episode) raises `BatchTooLarge`
        naming the file and the limit. A saved batch takes about 100-300 bytes per token
        with every field, so the defaults hold millions of tokens; pass larger limits for
        a bigger file. A file that is not a batch raises `NotABatchFile`, one cut short
        ValueError (naming the file and line), EOFError or OSError (a cut or damaged gzip
        stream); all of them name the file except a damaged gzip stream's.
        """
        header, records = read_records(Path(path), max_bytes, max_line_bytes)
        per_token = [r.pop("_fields", {}) for r in records]
        batch = cls([Episode.from_dict(r) for r in records])
        B, T = batch.tensors["input_ids"].shape
        for name in header["fields"]:
            t = torch.zeros((B, T), dtype=TOKEN_FIELDS[name][0])
            for b, vals in enumerate(per_token):
                t[b, : len(vals[name])] = torch.tensor(vals[name], dtype=TOKEN_FIELDS[name][0])
            batch.tensors[name] = t
        batch.meta = header.get("meta", {})
        return batch

    def __repr__(self) -> str:
        s = self.summary()
        fields_ = ", ".join(k for k in TOKEN_FIELDS if k in self.tensors)
        return (f"TrajectoryBatch({len(self)} episodes, reward {s['reward/mean']:.3g}±{s['reward/std']:.3g}, "
                f"success {format_rate(s['env/success_rate'], '.0%')}, fields: {fields_})")

    def _repr_html_(self) -> str:
        """The summary line, then one row per episode (the first 20) narrow enough for a
        notebook's output (`workbench.trajectory_views.batch_html`)."""
        return batch_html(self)


#: The seeds' name for a batch of trajectories.
RolloutData = TrajectoryBatch

__all__ = ["Episode", "Trajectory", "Turn", "TrajectoryBatch", "RolloutData", "TOKEN_FIELDS", "BatchTooLarge",
           "NotABatchFile", "MAX_LOAD_BYTES", "MAX_LINE_BYTES"]
