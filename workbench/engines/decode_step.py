"""One decode step of a Llama-family model without transformers' module stack.

The hf engine prefills with the model's own forward (any architecture, padding, the
prefix cache), then decodes one token per row per step. On a CPU a decode step of a
small model costs more in the machinery around the matmuls than people expect: the
module calls, the mask built for every layer, peft's per-linear casts, and, for skinny
fp32 matmuls, the orientation MKL is given. `DecodeStep` runs that step as plain tensor
code over the model's own parameters (references, so an optimizer step or
`load_state_dict` is seen at once):

- on a CPU, q/k/v run as one matmul and gate/up as another, over fused copies of their
  weights that are made again only when one of the source tensors changed (a LoRA
  policy's frozen base is copied once; on accelerators each runs alone, no copies);
- the (B, T) padding mask becomes one (B, 1, 1, T) mask shared by every layer;
- q and k get their rotary embeddings in one pass (concatenated); attention of the one
  new query is one `scaled_dot_product_attention` call per layer in the cache's dtype
  (bf16 as the model's own sdpa runs it, accumulating in fp32), each KV head's G query
  heads as its G queries (no `repeat_kv`), or on a CPU the engine's compiled kernel
  (`kernels`, `cpu_kernels.py`: one pass over the cache in fp32), which also runs the RMSNorms and
  `silu(gate) * up` as one op each; a prompt every row shares (a GRPO group's)
  can be read once for all rows (`shared_prefix`: two matmuls for it, two for the rest,
  in fp32; the engine asks for it off the CPU only, see `HFEngine.share_prompt_reads`);
- a LoRA layer of peft (the bf16 path, where the engine cannot merge: `merged.py`) runs
  its adapters the way peft does (input cast to the adapters' fp32, `B(A(x)) * scale`
  added to the base output, cast back), without the module calls, the A's of a fused
  group stacked and their B's block-diagonal;
- on a CPU, fp32 linears run as `W @ x.T` (measured on this 2-core EPYC at 8 rows: the
  SmolLM2 layers 26 vs 32 ms per step, its LM head 5 vs 11 ms), or, with `packed` (the
  engine's packed weights, `inference.packed_decode`), through MKL's packed copies of the
  weights from 4 rows up and as `x @ W.T` below (on a 2-core Xeon, 2-3 rows: 25-28 vs 59 ms,
  `packed_matmul.py`); bf16 linears through oneDNN's packed copies (`onednn_weights.py`);
- with a `MatmulHelper` (`split`: the engine's timed "one thread + helper" mode,
  `decode_threads.py`), large weights are multiplied in two halves of their outputs at
  once, one per thread (`SPLIT_MIN_BYTES`; with `packed`, each half packed apart); the
  logits are the same to the dtype's rounding (the same bits on the CPUs measured; a
  half-width product may run another kernel elsewhere).

The math is the model's (`modeling_llama`): RMSNorm in fp32 cast back before the weight,
rotary embeddings from the model's own `rotary_emb`, residual adds in the model dtype,
logits returned in fp32. `tests/test_decode_step.py` checks its logits against the
model's forward on the same cache, in fp32 and bf16, plain and LoRA.

`DecodeStep.build(model)` returns None for anything else (another architecture, a
sliding window, biased MLPs, LoRA variants, a bias on LoRA's B, or dropout in training mode), and the engine
then decodes with the model's forward as before.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from workbench.engines.decode_threads import MatmulHelper
from workbench.engines.onednn_weights import OneDNNWeights
from workbench.engines.packed_matmul import PackedWeights
from workbench.engines.weights import is_lora_layer, version_signature

#: Architectures whose decoder layer is LlamaDecoderLayer's math (qwen2: biased q/k/v; qwen3: an
#: RMSNorm over each head's queries and keys before the rotary embedding).
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
#: With a `MatmulHelper`, weights of at least this many bytes are multiplied in two halves
#: at once. In the engine on this CPU (SmolLM2 + LoRA r=16, 8 rows, ms per decode step,
#: one thread -> one thread + helper): fp32 67-69 -> 47-50 (two OpenMP threads: 60-63);
#: bf16 (the LM head and gate/up split) 33-34 -> 30-33, about the run-to-run noise.
SPLIT_MIN_BYTES = 2_000_000
#: The same for a `SpinHelper` (compiled, no wake-up per product): every projection of SmolLM2's
#: layers (0.66 MB and up in bf16) is split.
COMPILED_SPLIT_MIN_BYTES = 256_000


@dataclass
class _Proj:
    """Projections that read the same input (q/k/v; gate/up; or one alone), as one matmul.

    `weight` (N, K) holds the outputs' base weights one after another (a reference when
    there is one projection, a fused copy otherwise), `splits` their widths. A LoRA
    adapter per output is run as peft does (the input cast to the adapters' dtype,
    `B(A(x)) * scale` added to the base output, the sum cast back), fused the same way:
    `lora_a` (R, K) stacks the A's, `lora_b` (N, R) is block-diagonal with each B times
    its scale. Outputs without an adapter get zero rows in `lora_b`.
    """

    weight: torch.Tensor  # (N, K)
    bias: torch.Tensor | None  # (N,)
    splits: list[int]
    lora_a: torch.Tensor | None = None  # (R, K), fp32 in peft's bf16 setup
    lora_b: torch.Tensor | None = None  # (N, R)
    transposed: bool = False  # compute W @ x.T (fp32 on a CPU: see the module docstring)

    def __call__(self, x: torch.Tensor, split: "MatmulHelper | None" = None,
                 packed: "PackedWeights | OneDNNWeights | None" = None, wide: int = 0) -> list[torch.Tensor]:
        """x: (B, K) -> one (B, N_i) tensor per output, in x's dtype. With `split`, a
        weight of at least `SPLIT_MIN_BYTES` is multiplied in two halves of its outputs at
        once, one on the calling thread and one on the helper's (the same products). With
        `packed` (on a CPU), through its packed copy of the weight when it packs this
        weight's dtype: MKL's for fp32 (packed_matmul.py), oneDNN's for bf16 (onednn_weights.py).
        `wide` > 0: the caller runs on one thread and the base product runs on `wide` threads
        (`DecodeStep.__call__`'s `product_threads`)."""
        y = self.fused(x, split, packed, wide)  # (B, N)
        return list(y.split(self.splits, dim=-1)) if len(self.splits) > 1 else [y]

    def fused(self, x: torch.Tensor, split: "MatmulHelper | None" = None,
              packed: "PackedWeights | OneDNNWeights | None" = None, wide: int = 0) -> torch.Tensor:
        """x: (B, K) -> the (B, N) outputs side by side (`__call__` without the split)."""
        packs = packed is not None and packed.dtype == self.weight.dtype
        with _Wide(wide):
            y = self._packed_product(x, split, packed) if packs else None
            if y is None:  # below the packed row minimum (x @ W.T there: see PACKED_MIN_ROWS), or not packed
                y = self._product(x, split, self.transposed and not packs)  # (B, N)
        if self.lora_a is not None:
            y = (y + F.linear(F.linear(x.to(self.lora_a.dtype), self.lora_a), self.lora_b)).to(x.dtype)
        return y

    def _packed_product(self, x: torch.Tensor, split: "MatmulHelper | None",
                        packed: "PackedWeights | OneDNNWeights") -> torch.Tensor | None:
        """x (B, K) @ weight.T + bias -> (B, N) through packed weights (with `split`, a large
        weight's two halves of outputs packed apart, one per thread); None below the packed
        row minimum."""
        N = self.weight.shape[0]
        compiled = getattr(split, "compiled", False)  # a SpinHelper: halves meet without a wake-up
        least = COMPILED_SPLIT_MIN_BYTES if compiled else SPLIT_MIN_BYTES
        if split is None or N < 2 or self.weight.numel() * self.weight.element_size() < least:
            return packed.linear(x, self.weight, self.bias)
        xp = packed.pad(x)  # (P, K)
        if xp is None:
            return None
        h, halves = N // 2, [None, None]
        if compiled:
            skinny = getattr(packed, "skinny_halves", None)  # SkinnyWeights: one output, panels split
            y = skinny(xp, self.weight, self.bias) if skinny is not None else None
            if y is not None:
                return y[: x.shape[0]]  # (B, N) of the (P, N)
            kind, *operands = packed.half_operands(xp, self.weight, self.bias, h)
            y = split.linear_halves(kind, xp, *operands)  # (P, N), fp32 from MKL's kernel
            return y.to(packed.dtype)[: x.shape[0]]  # (B, N)

        def half(i: int, part: tuple[int, int]) -> None:
            halves[i] = packed.product(xp, self.weight, self.bias, part)  # (P, N_i)

        split.run(lambda: half(0, (0, h)), lambda: half(1, (h, N)))
        return torch.cat(halves, dim=1)[: x.shape[0]]  # (B, N)

    def _product(self, x: torch.Tensor, split: "MatmulHelper | None", transposed: bool) -> torch.Tensor:
        """x (B, K) @ weight.T + bias -> (B, N) (as W @ x.T, a transposed view, when `transposed`)."""
        N = self.weight.shape[0]
        halves = split is not None and N > 1 and self.weight.numel() * self.weight.element_size() >= SPLIT_MIN_BYTES
        if transposed:
            if halves:
                yt = x.new_empty((N, x.shape[0]))  # (N, B): each half a block of rows
                h = N // 2
                split.run(lambda: torch.mm(self.weight[:h], x.t(), out=yt[:h]),
                          lambda: torch.mm(self.weight[h:], x.t(), out=yt[h:]))
                y = yt.t()  # (B, N), a transposed view
            else:
                y = torch.mm(self.weight, x.t()).t()  # (B, N), a transposed view
            if self.bias is not None:
                y = y + self.bias
        elif halves:
            y = x.new_empty((x.shape[0], N))  # (B, N)
            h, w, b = N // 2, self.weight, self.bias
            if b is None:
                split.run(lambda: torch.mm(x, w[:h].t(), out=y[:, :h]), lambda: torch.mm(x, w[h:].t(), out=y[:, h:]))
            else:  # addmm: what F.linear computes with a bias
                split.run(lambda: torch.addmm(b[:h], x, w[:h].t(), out=y[:, :h]),
                          lambda: torch.addmm(b[h:], x, w[h:].t(), out=y[:, h:]))
        else:
            y = F.linear(x, self.weight, self.bias)  # (B, N)
        return y


@dataclass
class _Source:
    """What one linear module computes: base weight and bias, and its active LoRA adapter."""

    weight: torch.Tensor  # (N, K)
    bias: torch.Tensor | None
    lora: tuple[torch.Tensor, torch.Tensor, float] | None  # (A (r, K), B (N, r), scale)


def _source(module: Any) -> _Source | None:
    """The `_Source` of an nn.Linear or a peft LoRA Linear; None for anything else or a
    LoRA variant this step does not reproduce."""
    if is_lora_layer(module):
        base = module.get_base_layer()
        if type(base) is not torch.nn.Linear or getattr(module, "merged", False):
            return None
        if getattr(module, "disable_adapters", False):
            return _Source(base.weight, base.bias, None)
        active = [a for a in module.active_adapters if a in module.lora_A]
        if len(active) > 1:
            return None
        lora = None
        for name in active:
            if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name, False):
                return None  # DoRA and other variants: the model's forward
            if (getattr(module, "lora_bias", {}) or {}).get(name):
                return None  # a bias on B (peft's lora_bias): the model's forward
            dropout = module.lora_dropout[name]
            if module.training and isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                return None  # a sampled dropout mask: the model's forward
            lora = (module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name]))
        return _Source(base.weight, base.bias, lora)
    if type(module) is torch.nn.Linear:
        return _Source(module.weight, module.bias, None)
    return None


def _base_tensors(sources: list[_Source]) -> list[torch.Tensor | None]:
    return [t for s in sources for t in (s.weight, s.bias)]


def _lora_tensors(sources: list[_Source]) -> list[torch.Tensor | None]:
    return [t for s in sources for t in (s.lora[:2] if s.lora else ())]


def _fuse_base(sources: list[_Source]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (N, K) weight and (N,) bias of every source's output, one after another
    (references when there is one source, a copy otherwise)."""
    if len(sources) == 1:
        return sources[0].weight, sources[0].bias
    with torch.no_grad():
        weight = torch.cat([s.weight for s in sources])  # (N, K)
        bias = None
        if any(s.bias is not None for s in sources):
            bias = torch.cat([s.bias if s.bias is not None else s.weight.new_zeros(s.weight.shape[0])
                              for s in sources])
    return weight, bias


def _fuse_lora(sources: list[_Source]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Stacked A's (R, K) and the block-diagonal (N, R) of each B times its scale (zero rows
    for outputs without an adapter); (None, None) when no source has one."""
    adapters = [s.lora for s in sources if s.lora is not None]
    if not adapters:
        return None, None
    with torch.no_grad():
        a_ref = adapters[0][0]
        lora_a = torch.cat([a for a, _, _ in adapters])  # (R, K)
        lora_b = a_ref.new_zeros((sum(s.weight.shape[0] for s in sources), lora_a.shape[0]))  # (N, R)
        row = col = 0
        for s in sources:
            if s.lora is not None:
                a, b, scale = s.lora
                lora_b[row:row + b.shape[0], col:col + a.shape[0]] = b.to(a_ref.dtype) * scale
                col += a.shape[0]
            row += s.weight.shape[0]
    return lora_a, lora_b


@dataclass
class _Layer:
    qkv: _Proj
    o: _Proj
    gate_up: _Proj
    down: _Proj
    norm_in: torch.Tensor  # (E,) input_layernorm weight
    norm_post: torch.Tensor  # (E,) post_attention_layernorm weight
    eps_in: float
    eps_post: float
    qk_norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None  # (D,) q_norm, k_norm weights, eps


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm (and Qwen3RMSNorm): normalise the last dimension in fp32, cast back,
    then scale. x: (B, E), or (B, heads, D) for qwen3's per-head norms."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`qk * cos + _rotate_half(qk) * sin` (qk (B, heads, D) contiguous), with the halves of
    each head swapped by one `flip` and `sin_signed` = [-sin_1, sin_2] made once per step:
    the same products and sum (a negation is exact), four ops instead of eight."""
    B, n, D = qk.shape
    swapped = qk.view(B, n, 2, D // 2).flip(2).view(B, n, D)  # (B, heads, D): [x_2, x_1]
    return qk * cos + swapped * sin_signed


def _causal_lm_parts(model: Any) -> tuple[Any, Any] | None:
    """(the LlamaModel-like body, the lm_head) under peft / ForCausalLM wrappers."""
    inner = model
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    body, head = getattr(inner, "model", None), getattr(inner, "lm_head", None)
    if body is None or head is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return None
    return body, head


class DecodeStep:
    """Decode one token per row through a Llama-family model's parameters (module docstring).

    Build it with `DecodeStep.build(model, previous)`: passing the last step keeps its
    fused copies (q/k/v and gate/up, on a CPU) of every group whose tensors are unchanged.
    """

    def __init__(self, body: Any, embed: torch.Tensor, layers: list[_Layer], norm: torch.Tensor,
                 norm_eps: float, head: _Proj, n_heads: int, n_kv: int, head_dim: int,
                 fused: dict[tuple[int, str], tuple[tuple, Any]]):
        self.body, self.embed, self.layers, self.norm, self.norm_eps = body, embed, layers, norm, norm_eps
        self.head, self.n_heads, self.n_kv, self.head_dim = head, n_heads, n_kv, head_dim
        self.scaling = head_dim ** -0.5
        self._fused = fused  # (group index, "base" | "lora") -> (signature of its tensors, fused tensors)
        # the `cpu_kernels` module where the engine set it (on a CPU, `inference.cpu_kernels`): a CPU step
        # of bf16 or fp32 runs its attention (reading no shared prefix), RMSNorms and SiLU-times-up through it
        self.kernels: Any | None = None

    @classmethod
    def build(cls, model: Any, previous: "DecodeStep | None" = None) -> "DecodeStep | None":
        """The step for `model` (plain or peft LoRA), or None when it is not one this
        step reproduces exactly (see the module docstring)."""
        config = getattr(model, "config", None)
        parts = _causal_lm_parts(model)
        if config is None or parts is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            return None
        if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
            return None
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return None
        body, lm_head = parts
        embed = body.embed_tokens
        if type(embed) is not torch.nn.Embedding:
            return None
        weight = embed.weight
        on_cpu = weight.device.type == "cpu"
        transposed = on_cpu and weight.dtype == torch.float32
        old = previous._fused if previous is not None else {}
        fused: dict[tuple[int, str], tuple[tuple, Any]] = {}
        groups = itertools.count()  # the key of each group's cached copies, in build order

        def cached(key: tuple[int, str], tensors: list[torch.Tensor | None], make: Any) -> Any:
            """`make()`, or the previous step's result when `tensors` are unchanged (the base
            weights of a LoRA policy are frozen: only its adapters are fused again)."""
            sig = version_signature(tensors)
            fused[key] = old[key] if key in old and old[key][0] == sig else (sig, make())
            return fused[key][1]

        def group(modules: list[Any]) -> Any:
            sources = [_source(m) for m in modules]
            if any(s is None for s in sources):
                return None
            if len(sources) > 1 and not on_cpu:  # no copies on accelerators: one matmul each
                return _Split([group([m]) for m in modules])
            i = next(groups)
            weight, bias = cached((i, "base"), _base_tensors(sources), lambda: _fuse_base(sources))
            lora_a, lora_b = cached((i, "lora"), _lora_tensors(sources), lambda: _fuse_lora(sources))
            return _Proj(weight, bias, [s.weight.shape[0] for s in sources], lora_a, lora_b, transposed)

        layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qk_norm = None
            if getattr(attn, "q_norm", None) is not None or getattr(attn, "k_norm", None) is not None:
                norms = (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
                if any(type(n).__name__ != "Qwen3RMSNorm" for n in norms):
                    return None
                qk_norm = (norms[0].weight, norms[1].weight, norms[0].variance_epsilon, norms[1].variance_epsilon)
            projs = [group([attn.q_proj, attn.k_proj, attn.v_proj]), group([attn.o_proj]),
                     group([mlp.gate_proj, mlp.up_proj]), group([mlp.down_proj])]
            if any(p is None for p in projs):
                return None
            layers.append(_Layer(*projs, layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                                 layer.input_layernorm.variance_epsilon,
                                 layer.post_attention_layernorm.variance_epsilon, qk_norm))
        head = group([lm_head])
        if head is None:
            return None
        n_heads = config.num_attention_heads
        n_kv = getattr(config, "num_key_value_heads", None) or n_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        return cls(body, weight, layers, body.norm.weight, body.norm.variance_epsilon, head, n_heads, n_kv,
                   head_dim, fused)

    def packed_bytes(self) -> int:
        """Bytes of the weights the step's products would pack: fp32 (MKL, packed_matmul.py)
        or bf16 (oneDNN, onednn_weights.py) weights on a CPU, all of one dtype; 0 otherwise."""
        projs = [p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [self.head]
        if not all(isinstance(p, _Proj) for p in projs) or self.embed.device.type != "cpu":
            return 0
        if len({p.weight.dtype for p in projs}) != 1 or projs[0].weight.dtype not in (torch.float32, torch.bfloat16):
            return 0
        return sum(p.weight.numel() * p.weight.element_size() for p in projs)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the step's product weights (the head's)."""
        return self.head.weight.dtype

    def __call__(self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                 cache: Any, shared_prefix: int = 0, split: "MatmulHelper | None" = None,
                 packed: "PackedWeights | OneDNNWeights | None" = None,
                 col: torch.Tensor | None = None, logits_out: torch.Tensor | None = None,
                 product_threads: int = 0) -> torch.Tensor:
        """tokens (B,), attention (B, T) with 1 at real cache positions (the new token's
        included), positions (B, 1), `cache` with one growing layer per decoder layer;
        appends this step's keys/values to it and returns the (B, V) fp32 logits.

        `shared_prefix`: the first this many cache positions hold the same keys and values
        in every row (a GRPO group's prompt, prefilled once). Attention then reads them
        from row 0 only, one matmul for all rows' queries, instead of once per row: the
        fp32 conversion and the reads of the cache are most of a decode step's attention.
        `split`, `packed`: how the large matmuls run (`_Proj`).

        `col` (a (1,) device tensor; the static form a CUDA graph replays, `graphed.py`):
        `attention` is then the (B, cap) mask of the whole cache buffer, room included; the
        step marks column `col` real in it, writes each layer's new keys/values there
        (`write_at`) and attends over the whole buffer, so no shape changes from step to step.
        The caller advances the layers' lengths after.

        `logits_out`: a (B, V) fp32 tensor the logits of a 16-bit model are written into
        (and returned) instead of a new one: a fresh (B, V) fp32 tensor per step faults in
        its pages every step on a CPU (at 128 rows x 49152 ids, 25 MB: ~4300 page faults,
        24 ms against 7 ms for a copy into a kept buffer on a 2-core Xeon VM, 2026-12-01).

        `product_threads` > 1 (a CPU step on several threads): the step runs its small ops (norms,
        rotary, residuals, SiLU, casts) on one thread and only the base products and the
        attention on `product_threads`. Under passive OpenMP waits every op that goes parallel
        first wakes the sleeping threads: on a 2-core EPYC VM an add of two (128, 576) bf16
        tensors took 19 us on one thread and 83 us on two (2026-12-03). The thread count is
        `product_threads` again when the step returns."""
        spin = getattr(split, "compiled", False)  # a SpinHelper: its thread spins while the step runs
        wide = product_threads if product_threads > 1 else 0
        if spin:
            split.begin()
        if wide:
            torch.set_num_threads(1)
        try:
            return self._step(tokens, attention, positions, cache, shared_prefix, split, packed, col, logits_out, wide,
                              spin)
        finally:
            if wide:
                torch.set_num_threads(wide)
            if spin:
                split.end()

    def _step(self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: Any,
              shared_prefix: int, split: "MatmulHelper | None", packed: "PackedWeights | OneDNNWeights | None",
              col: torch.Tensor | None, logits_out: torch.Tensor | None, wide: int, spin: bool) -> torch.Tensor:
        """`__call__`'s step; `wide` > 0: the products and attention on that many threads, the rest on one;
        `spin`: `split` is a `SpinHelper` (the kernels' attention shares its pairs with it)."""
        B = tokens.shape[0]
        if col is not None:
            if shared_prefix:
                raise ValueError("the static step (col) reads no shared prefix")
            attention.index_fill_(1, col, 1)
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        G = H // KV
        h = F.embedding(tokens, self.embed)  # (B, E)
        kernels = self.kernels if self._uses_kernels(h) else None
        norm = kernels.rms_norm if kernels is not None else _rms_norm
        cos, sin = self.body.rotary_emb(h[:, None, :], positions)  # (B, 1, D) each: broadcasts over (B, heads, D)
        half = D // 2
        sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # (B, 1, D), see `_rotary`
        allowed = (attention != 0)[:, None, None, :]  # (B, 1, 1, T): True at real positions
        # An additive (B, 1, 1, T) mask made once per step: 0 at real positions, -inf elsewhere. sdpa
        # turns a boolean one into exactly this (`where`, in the query's dtype) in every layer; the
        # shared read's fp32 scores take it in fp32.
        bias_dtype = torch.float32 if shared_prefix and B > 1 else cache.layers[0].keys.dtype
        bias = torch.zeros(allowed.shape, dtype=bias_dtype, device=h.device).masked_fill_(~allowed, float("-inf"))
        for layer, kv in zip(self.layers, cache.layers):
            x = norm(h, layer.norm_in, layer.eps_in)  # (B, E)
            y = layer.qkv.fused(x, split, packed, wide)  # (B, (H + 2 KV) D): q, k, v side by side
            if layer.qk_norm is None:
                qk = y[:, : (H + KV) * D].reshape(B, H + KV, D)  # (B, H + KV, D): rotated at once
            else:  # qwen3: each head's queries and keys normalised before the rotation
                q_w, k_w, q_eps, k_eps = layer.qk_norm
                q, k = y[:, : H * D].reshape(B, H, D), y[:, H * D: (H + KV) * D].reshape(B, KV, D)
                qk = torch.cat([norm(q, q_w, q_eps), norm(k, k_w, k_eps)], dim=1)
            v = y[:, (H + KV) * D:]
            qk = _rotary(qk, cos, sin_signed)
            q, k, v = qk[:, :H].reshape(B, KV, G, D), qk[:, H:, None, :], v.reshape(B, KV, 1, D)  # (B, KV, G|1, D)
            keys, values = kv.update(k, v) if col is None else kv.write_at(col, k, v)  # (B, KV, T|cap, D) each
            with _Wide(wide):
                out = self._attention(q, keys, values, bias, shared_prefix, spin)
            out = out.to(h.dtype).reshape(B, H * D)
            h = h + layer.o(out, split, packed, wide)[0]
            x = norm(h, layer.norm_post, layer.eps_post)
            gate, up = layer.gate_up(x, split, packed, wide)
            fuse = kernels is not None and gate.stride(-1) == 1 and up.stride(-1) == 1  # not a W @ x.T view
            act = kernels.silu_mul(gate, up) if fuse else F.silu(gate) * up  # (B, I)
            h = h + layer.down(act, split, packed, wide)[0]
        h = norm(h, self.norm, self.norm_eps)
        logits = self.head.fused(h, split, packed, wide)  # (B, V) in the model's dtype
        if wide:  # a (B, V) fp32 copy: large enough for every thread
            torch.set_num_threads(wide)
        if logits_out is not None and logits.dtype != torch.float32:
            return logits_out.copy_(logits)
        return logits.float()  # (B, V)

    def _uses_kernels(self, x: torch.Tensor) -> bool:
        """Whether ops on tensors like `x` run through `kernels` (set, on the CPU, bf16 or fp32)."""
        return self.kernels is not None and x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float32)

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   shared: int, spin: bool = False) -> torch.Tensor:
        """q (B, KV, G, D), keys/values (B, KV, T, D) -> (B, KV, G, D). Without `shared`: one
        fused op in the cache's dtype (each KV head's G queries against its keys; bf16 as the
        model's own sdpa, which accumulates in fp32), `mask` (B, 1, 1, T) additive in the
        cache's dtype (0 at real positions, -inf elsewhere). With `shared` (and B > 1):
        positions below it read from row 0 (see `__call__`), in fp32, `mask` the additive fp32 one.
        With `kernels` (a CPU step without `shared`): its `decode_attention` instead of sdpa, one
        pass over each row's keys and values in fp32 (`cpu_kernels.py`); with `spin` (the step's
        helper is a `SpinHelper`), half of its (row, KV head) pairs on the helper's thread."""
        B, KV, G, D = q.shape
        if self._uses_kernels(keys) and (not shared or B == 1) and keys.stride(-1) == 1 and values.stride(-1) == 1:
            return self.kernels.decode_attention(q.to(keys.dtype), keys, values, mask, self.scaling,
                                                 helper=spin)  # (B, KV, G, D)
        if not shared or B == 1:
            return F.scaled_dot_product_attention(q.to(keys.dtype), keys, values, attn_mask=mask,
                                                  scale=self.scaling)  # (B, KV, G, D)
        q, bias = q.float(), mask
        qh = q.permute(1, 0, 2, 3).reshape(KV, B * G, D)  # every row's queries, per KV head
        head = torch.matmul(qh, keys[0, :, :shared].float().transpose(-1, -2))  # (KV, B*G, P)
        head = head.reshape(KV, B, G, shared).permute(1, 0, 2, 3)  # (B, KV, G, P)
        tail = torch.matmul(q, keys[:, :, shared:].float().transpose(-1, -2))  # (B, KV, G, T - P)
        probs = torch.softmax(torch.cat([head, tail], dim=-1) * self.scaling + bias, dim=-1)  # (B, KV, G, T)
        p_head = probs[..., :shared].permute(1, 0, 2, 3).reshape(KV, B * G, shared)  # (KV, B*G, P)
        out = torch.matmul(p_head, values[0, :, :shared].float())  # (KV, B*G, D)
        out = out.reshape(KV, B, G, D).permute(1, 0, 2, 3)  # (B, KV, G, D)
        return out + torch.matmul(probs[..., shared:], values[:, :, shared:].float())


class _Wide:
    """`with _Wide(n):` runs its body on `n` OpenMP threads and the caller's one thread after
    (a step with `product_threads`); n = 0 changes nothing."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __enter__(self) -> None:
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        if self.n:
            torch.set_num_threads(1)


class _Split:
    """Several one-output `_Proj`s called on the same input (accelerators: no fused copies)."""

    def __init__(self, projs: list[_Proj]):
        self.projs = projs

    def __call__(self, x: torch.Tensor, split: "MatmulHelper | None" = None,
                 packed: "PackedWeights | OneDNNWeights | None" = None, wide: int = 0) -> list[torch.Tensor]:
        return [p(x, split, packed, wide)[0] for p in self.projs]

    def fused(self, x: torch.Tensor, split: "MatmulHelper | None" = None,
              packed: "PackedWeights | OneDNNWeights | None" = None, wide: int = 0) -> torch.Tensor:
        return torch.cat(self(x, split, packed, wide), dim=-1)  # (B, N)
