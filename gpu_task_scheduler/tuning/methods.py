"""The pausing method an ``early_stop`` or ``pbt`` config names, built for the engine
(engine/pauses.py): the one module of tuning/ that knows every method, as Ray Tune's scheduler
registry does; each method's module depends only on tuning/base.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from .stopping import Pausing
from .trials import Hyperband, PromotionAsha

if TYPE_CHECKING:
    from .pbt import Pbt

Method: TypeAlias = "PromotionAsha | Hyperband | Pbt"


def method_for(rule: Pausing, *, population: int = 0, slots: int = 0) -> Method:
    """The pausing method an ``early_stop`` rule names (``stopping.parse_early_stop`` checked it),
    or population-based training (the ``pbt`` config) of ``population`` members on ``slots``."""
    assert rule.max_step is not None
    if rule.method == "pbt":
        from .pbt import Pbt, PbtRule  # only a config with pbt needs it

        assert isinstance(rule, PbtRule)
        return Pbt(rule.config, population=population, slots=slots)
    kind = Hyperband if rule.method == "hyperband" else PromotionAsha
    return kind(
        min_step=rule.min_step,
        max_step=rule.max_step,
        reduction_factor=rule.reduction_factor,
        mode=rule.mode,
        objectives=rule.objectives,
    )
