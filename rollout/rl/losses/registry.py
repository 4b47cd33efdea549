"""Losses by name: the built-in ones, and a researcher's own by `package.module:attribute`.

Contract:
- `BUILT_IN` maps each built-in loss's name (`ppo`, `truncated_is`, `cispo`, `gspo`) to its class; a new
  built-in loss is one module beside these and one entry here. `on_tinker()` names those Tinker can train.
- `loss_from(spec, params)` is the loss `spec` names, made with `params` (its keyword arguments, such as
  `clip_high`): a built-in name, or a reference to a class (made with `params`) or to a loss object (which
  takes no `params`), imported from the installed packages, the working directory or $PYTHONPATH
  (rollout.references) as environments are. Anything wrong (an unknown name, a reference that does not import
  or is no `PolicyLoss`, a parameter the loss does not take or refuses) raises `LossError`, one line that says
  what to set.
"""

from __future__ import annotations

from collections.abc import Mapping

from rollout.references import ReferenceLoadError, import_reference
from rollout.rl.losses.cispo import CISPO
from rollout.rl.losses.gspo import GSPO
from rollout.rl.losses.ppo import PPO
from rollout.rl.losses.terms import PolicyLoss
from rollout.rl.losses.truncated_is import TruncatedIS

BUILT_IN: dict[str, type[PolicyLoss]] = {
    PPO.name: PPO,
    TruncatedIS.name: TruncatedIS,
    CISPO.name: CISPO,
    GSPO.name: GSPO,
}


def on_tinker() -> str:
    """The built-in losses a run on Tinker can train, in words."""
    # `tinker` is a class attribute of each built-in loss (the protocol states it of instances).
    names = [name for name, loss in BUILT_IN.items() if getattr(loss, "tinker", None) is not None]
    return ", ".join(names[:-1]) + " or " + names[-1]


class LossError(ValueError):
    """A loss cannot be made from what names it; the message says what to set. `in_params`: the loss was
    found, and its parameters are what is wrong."""

    def __init__(self, message: str, *, in_params: bool = False) -> None:
        super().__init__(message)
        self.in_params = in_params


def loss_from(spec: str, params: Mapping[str, float] | None = None) -> PolicyLoss:
    params = dict(params or {})
    if spec in BUILT_IN:
        made: object = _made(BUILT_IN[spec], spec, params)
    elif ":" in spec:
        try:
            found = import_reference(spec, "loss reference")
        except ReferenceLoadError as error:
            raise LossError(str(error)) from None
        if isinstance(found, type):
            made = _made(found, spec, params)
        elif params:
            raise LossError(
                f"{spec} is a loss object, made already: it takes no parameters ({', '.join(params)}); name its "
                "class instead, or set them where it is made",
                in_params=True,
            )
        else:
            made = found
    else:
        raise LossError(
            f"no loss {spec!r}: name a built-in one ({', '.join(BUILT_IN)}) or your own as package.module:attribute"
        )
    if not isinstance(made, PolicyLoss):
        raise LossError(
            f"{spec} is a {type(made).__name__}, not a policy loss: it needs name, tinker, tinker_config() and "
            "__call__(terms) (rollout.rl.losses.PolicyLoss)"
        )
    return made


def _made(cls: type, spec: str, params: dict[str, float]) -> object:
    try:
        return cls(**params)
    except TypeError as error:
        raise LossError(f"loss {spec} does not take these parameters: {error}", in_params=True) from None
    except ValueError as error:
        raise LossError(f"loss {spec}: {error}", in_params=bool(params)) from None
