"""RL numerics for language-model policies: advantages, losses, KL.

    advantages.py          GAE, GRPO (Dr.GRPO), RLOO, REINFORCE++ (+baseline), registry
    losses.py              PPO policy loss (dual-clip, clip-higher), GSPO, value loss
    rollout_correction.py  truncated importance weights against the engine's sampling logprobs (rollout_is)
    kl.py                  k1/k2/k3/abs KL estimators, apply_kl_penalty, KL controllers
    utils.py               masked mean/var/whiten, entropy, loss aggregation modes

Pure torch, device-agnostic, same function names and semantics as verl's
``verl/trainer/ppo/core_algos.py``.  Everything is re-exported here::

    from workbench import algo
    adv, ret = algo.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=0.95)
    loss, metrics = algo.compute_policy_loss(old_logp, logp, adv, mask)
"""

from workbench.algo.advantages import (
    GROUP_RELATIVE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageFn,
    compute_gae_advantage_return,
    compute_grpo_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
    compute_rloo_advantage,
    get_advantage_estimator,
    register_advantage_estimator,
)
from workbench.algo.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    kl_penalty,
)
from workbench.algo.losses import (
    PolicyLossFn,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_value_loss,
    get_policy_loss_fn,
    register_policy_loss,
)
from workbench.algo.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights
from workbench.algo.utils import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    # rollout correction
    "ROLLOUT_IS_LEVELS",
    "rollout_is_weights",
    # advantages
    "AdvantageEstimator",
    "GROUP_RELATIVE_ESTIMATORS",
    "AdvantageFn",
    "register_advantage_estimator",
    "get_advantage_estimator",
    "compute_gae_advantage_return",
    "compute_grpo_advantage",
    "compute_rloo_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_reinforce_plus_plus_baseline_advantage",
    # losses
    "PolicyLossFn",
    "register_policy_loss",
    "get_policy_loss_fn",
    "compute_policy_loss",
    "compute_policy_loss_gspo",
    "compute_value_loss",
    # kl
    "KL_ESTIMATORS",
    "kl_penalty",
    "apply_kl_penalty",
    "KLController",
    "FixedKLController",
    "AdaptiveKLController",
    # utils
    "LOSS_AGG_MODES",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "entropy_from_logits",
    "agg_loss",
]
