"""The variables a cache may record beside its logits (``PredictConfig.extra_variables``):
:class:`CacheVariable` and its registry :data:`CACHE_VARIABLES` (``head_weight``,
``head_bias``), computed once per prediction sample (:func:`uqvision.predict.core.
_cache_variables`: those a :class:`~uqvision.predict.PredictConfig` asks for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from uqmetrics.metrics.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = ["CACHE_VARIABLES", "CacheVariable"]


@dataclass(frozen=True)
class CacheVariable:
    """A variable a cache may record beside its logits (``PredictConfig.extra_variables``).

    Attributes
    ----------
    name : str
    dims : tuple of str
        Its dims in the cache (``class``: the cache's classes, the model's outputs).
    description : str
    compute : callable
        ``compute(network) -> ndarray`` of shape ``dims``: computed once per prediction sample
        (network), before its images are read.
    """

    name: str
    dims: tuple[str, ...]
    description: str
    compute: Callable[[torch.nn.Module], np.ndarray]


def _linear_head(model: torch.nn.Module, name: str) -> torch.nn.Linear:
    """The network's classifier (timm's ``get_classifier()``), refused unless one Linear."""
    import torch  # computed on a network: torch is there (the options import no torch)

    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    if isinstance(head, torch.nn.Linear):
        return head
    raise ValueError(f"cache variable {name!r} needs a network whose classifier (timm's "
                     f"get_classifier()) is one torch.nn.Linear; {type(model).__name__} has "
                     f"{type(head).__name__}")


def _head_bias(model: torch.nn.Module) -> np.ndarray:
    head = _linear_head(model, "head_bias")
    if head.bias is None:
        raise ValueError(f"cache variable 'head_bias': the classifier of "
                         f"{type(model).__name__} has no bias")
    return head.bias.detach().float().cpu().numpy()


#: Variables a cache may record beside its logits: name -> :class:`CacheVariable`
#: (``PredictConfig.extra_variables``; a cache's ``extra_variables`` attr lists them).
CACHE_VARIABLES: Registry[CacheVariable] = Registry("cache variable")
CACHE_VARIABLES.register(CacheVariable(
    "head_weight", ("class", "feature"),
    "the weights of the network's linear classifier (class, feature), float32",
    lambda m: _linear_head(m, "head_weight").weight.detach().float().cpu().numpy()))
CACHE_VARIABLES.register(CacheVariable(
    "head_bias", ("class",), "the bias of the network's linear classifier (class,), float32",
    _head_bias))
