"""Policy losses for off-policy RL on token sequences, as plug-ins (docs/rl-math.md).

One module per loss (`registry.BUILT_IN` names them), each a `PolicyLoss` (`terms`: what a loss is given and
answers) with its own parameters, checked when it is made; `core` is the step around any loss (IcePop's mask,
normalisation and metrics) and `registry` names them, a researcher's own loss included
(`trainer.loss=my_losses:MyLoss`).
"""

from rollout.rl.losses.cispo import CISPO
from rollout.rl.losses.core import LossConfig, LossMetrics, NonFiniteLoss, policy_loss, staleness_histogram
from rollout.rl.losses.ppo import PPO
from rollout.rl.losses.registry import BUILT_IN, LossError, loss_from
from rollout.rl.losses.terms import PolicyLoss, TokenLoss, TokenTerms
from rollout.rl.losses.truncated_is import TruncatedIS

__all__ = [
    "BUILT_IN",
    "CISPO",
    "PPO",
    "LossConfig",
    "LossError",
    "LossMetrics",
    "NonFiniteLoss",
    "PolicyLoss",
    "TokenLoss",
    "TokenTerms",
    "TruncatedIS",
    "loss_from",
    "policy_loss",
    "staleness_histogram",
]
