"""KL estimators between the policy and a reference policy, the in-reward KL penalty and KL coefficient controllers.

Same numbers as verl's ``core_algos.kl_penalty``, ``AdaptiveKLController``,
``FixedKLController`` and ``ray_trainer.apply_kl_penalty``.

Simplified / changed relative to verl:
  * ``apply_kl_penalty`` works on tensors and a float coefficient instead of a
    ``DataProto`` and a controller, and does not update any controller; call
    ``controller.update(kl_value, n_steps=batch_size)`` yourself, as verl does
    right after penalising.
  * Unknown estimator names raise ValueError (verl raises NotImplementedError);
    no ``"full"`` estimator and no straight-through ``"+"`` variants.
  * ``KLController`` wraps both behaviours behind an ``adaptive`` flag.

Shape letters: B batch, T tokens.
"""

from __future__ import annotations

import torch

from workbench.algo.utils import masked_mean

__all__ = [
    "KL_ESTIMATORS",
    "kl_penalty",
    "apply_kl_penalty",
    "KLController",
    "FixedKLController",
    "AdaptiveKLController",
]

#: Valid ``estimator`` names for :func:`kl_penalty`.
KL_ESTIMATORS: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "kl") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    With d = logp - ref_logp (samples drawn from the policy):
      * ``"kl"`` / ``"k1"``: d (unbiased, can be negative).
      * ``"abs"``: |d|.
      * ``"mse"`` / ``"k2"``: 0.5 * d^2.
      * ``"low_var_kl"`` / ``"k3"``: exp(-d) + d - 1 (Schulman's k3, always >= 0),
        computed as verl does with -d clamped to [-20, 20] and the result
        clamped to [-10, 10].

    Args:
        log_probs: (B, T) policy log-probs of the sampled tokens.
        ref_log_probs: (B, T) reference log-probs of the same tokens.
        estimator: One of :data:`KL_ESTIMATORS`.

    Returns:
        (B, T) tensor.

    Raises:
        ValueError: for an unknown estimator, listing the valid names.
    """
    if estimator in ("kl", "k1"):
        return log_probs - ref_log_probs
    if estimator == "abs":
        return (log_probs - ref_log_probs).abs()
    if estimator in ("mse", "k2"):
        return 0.5 * (log_probs - ref_log_probs).square()
    if estimator in ("low_var_kl", "k3"):
        neg_d = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        kld = torch.exp(neg_d) - neg_d - 1
        return torch.clamp(kld, min=-10.0, max=10.0)
    raise ValueError(f"Unknown KL estimator {estimator!r}; valid: {list(KL_ESTIMATORS)}")


_kl_penalty = kl_penalty  # apply_kl_penalty's argument of the same name shadows the function


def apply_kl_penalty(
    token_level_rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, float]:
    """Subtract a per-token KL penalty from the rewards (KL-in-reward, as in classic RLHF PPO).

    ``penalized = rewards - kl_coef * kld * mask`` with ``kld = kl_penalty(...)``.
    The reported ``kl_value`` is the batch mean of each sequence's masked-mean
    kld (a fully masked row counts as 0), the number verl feeds to its KL controller.

    Args:
        token_level_rewards: (B, T) rewards before the penalty.
        log_probs: (B, T) rollout-policy log-probs of the sampled tokens.
        ref_log_probs: (B, T) reference log-probs.
        response_mask: (B, T), 1 on policy tokens.
        kl_coef: Penalty coefficient (e.g. ``controller.value``).
        kl_penalty: Estimator name, see :func:`kl_penalty`.

    Returns:
        ``(penalized_rewards (B, T), kl_value)`` without gradient.
    """
    with torch.no_grad():
        mask = response_mask.to(log_probs.dtype)
        kld = _kl_penalty(log_probs, ref_log_probs, kl_penalty) * mask  # (B, T)
        penalized = token_level_rewards - kl_coef * kld
        kl_value = masked_mean(kld, response_mask, axis=-1).mean().item()  # (B,) -> scalar
    return penalized, kl_value


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op.

    Args:
        kl_coef: The coefficient, exposed as ``.value``.
    """

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing (kept for interface compatibility)."""


class AdaptiveKLController:
    """Proportional KL controller of Ziegler et al. 2019 (arXiv 1909.08593), as in verl.

    ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)``;
    ``value *= 1 + error * n_steps / horizon``.

    Args:
        init_kl_coef: Starting coefficient.
        target_kl: The KL the controller steers towards (> 0).
        horizon: Larger -> slower adaptation (> 0).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int = 10000) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}.")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}.")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards the target.

        Args:
            current_kl: Measured KL (e.g. ``kl_value`` from :func:`apply_kl_penalty`).
            n_steps: Samples since the last update (verl passes the batch size).
        """
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class KLController:
    """KL coefficient that is either adaptive (:class:`AdaptiveKLController`) or fixed.

    Args:
        init_kl_coef: Starting coefficient, read back as ``.value``.
        target_kl: Target KL; required when ``adaptive``.
        adaptive: If False the coefficient never changes.
        horizon: Adaptation horizon for the adaptive rule.
    """

    def __init__(
        self,
        init_kl_coef: float,
        target_kl: float | None = None,
        adaptive: bool = True,
        horizon: int = 10000,
    ) -> None:
        self.adaptive = adaptive
        self._ctrl: AdaptiveKLController | FixedKLController
        if adaptive:
            if target_kl is None:
                raise ValueError("An adaptive KLController needs target_kl.")
            self._ctrl = AdaptiveKLController(init_kl_coef, target_kl, horizon)
        else:
            self._ctrl = FixedKLController(init_kl_coef)

    @property
    def value(self) -> float:
        """Current KL coefficient."""
        return self._ctrl.value

    @value.setter
    def value(self, new_value: float) -> None:
        """Set the coefficient (used when restoring a checkpoint)."""
        self._ctrl.value = float(new_value)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt the coefficient (no-op when not adaptive); see :meth:`AdaptiveKLController.update`."""
        self._ctrl.update(current_kl, n_steps)

    def __repr__(self) -> str:
        return f"KLController(value={self.value:.6g}, adaptive={self.adaptive})"
