"""Turn what a person calls a policy into a model: a checkpoint folder, "base", a Trainer,
a `Policy` or a torch module.

    model, tokenizer, config = load_policy("runs/gn/checkpoints/step_000002")
    model, tokenizer, config = load_policy("base", config)   # the run's model, no trained weights

A checkpoint folder holds `config.yaml` (the run's config) and `policy.safetensors` (the
trained weights: LoRA adapters, or the whole model when `model.use_lora` is False); the
model is built from `config.model` and those weights loaded on top, read through
`workbench.training.checkpoint.read_checkpoint` (verified, nothing unpickled). "base" is
`config.model` as loaded, without trained weights (what a LoRA policy is with its
adapters disabled).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.config import ConfigStore

__all__ = ["load_policy", "checkpoint_config", "policy_label"]


def checkpoint_config(path: str | Path) -> ConfigStore:
    """The run config a checkpoint folder (or a run folder) recorded in its `config.yaml`."""
    path = Path(path)
    file = path / "config.yaml"
    if not file.exists():
        raise FileNotFoundError(f"{path} has no config.yaml: give a checkpoint folder (step_000010/) or a run folder")
    return ConfigStore.load(file)


def _trained_module(config: ConfigStore, weights: dict[str, torch.Tensor] | None) -> tuple[torch.nn.Module, Any]:
    """`config.model` loaded, with LoRA adapters wrapped on and `weights` loaded when given."""
    from workbench.models import load_model_and_tokenizer
    from workbench.training.checkpoint import check_weights
    from workbench.training.policy import apply_lora

    m = config.model
    model, tokenizer = load_model_and_tokenizer(m.path, m.dtype, m.device, m.trust_remote_code)
    if weights is not None:
        if m.use_lora:
            model = apply_lora(model, m)
        expected = {n: p for n, p in model.named_parameters()
                    if (not m.use_lora) or "lora_" in n}
        check_weights("policy", weights, expected)
        model.load_state_dict(weights, strict=False)
    return model.eval().requires_grad_(False), tokenizer


def load_policy(spec: Any, config: ConfigStore | None = None) -> tuple[torch.nn.Module, Any, ConfigStore | None]:
    """(model in eval mode, tokenizer or None, config or None) for a policy `spec`:

    * a checkpoint folder (str or Path): its `config.yaml` (or `config`) + its weights;
    * "base": `config.model` without trained weights (needs `config`);
    * a `Trainer`: its policy module, tokenizer and config (nothing is copied);
    * a `Policy`: its module and tokenizer;
    * a torch module: itself (tokenizer None).
    """
    from workbench.training.policy import Policy

    if isinstance(spec, str) and spec == "base":
        if config is None:
            raise ValueError('"base" needs the run config (config=..., or a checkpoint on the other side)')
        model, tok = _trained_module(config, None)
        return model, tok, config
    if isinstance(spec, (str, Path)):
        from workbench.training.checkpoint import read_checkpoint

        cfg = config if config is not None else checkpoint_config(spec)
        data = read_checkpoint(spec)
        model, tok = _trained_module(cfg, data["tensors"]["policy"])
        return model, tok, cfg
    if hasattr(spec, "policy") and hasattr(spec, "config") and isinstance(getattr(spec, "policy"), Policy):
        return spec.policy.model, spec.policy.tokenizer, spec.config
    if isinstance(spec, Policy):
        return spec.model, spec.tokenizer, config
    if isinstance(spec, torch.nn.Module):
        return spec, None, config
    raise TypeError(f"cannot make a policy of {type(spec).__name__}: give a checkpoint folder, \"base\", a Trainer, "
                    "a Policy or a torch module")


def policy_label(spec: Any) -> str:
    """A short name for a policy spec (for tables and headings)."""
    if isinstance(spec, (str, Path)):
        return str(spec)
    return type(spec).__name__
