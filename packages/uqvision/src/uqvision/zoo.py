"""Named model zoos: ``uqvision sweep --zoo NAME`` (docs/conventions.md#v-1-zoos).

A zoo is a function that returns model names (``arch.tag`` for timm, ``tv/<name>.<WEIGHTS>``
for torchvision), registered in :data:`ZOOS` (a :class:`uqmetrics.metrics.registry.Registry`) with a
one-line description, its docstring's first line (``uqvision sweep --list-zoos``). The names are
not checked when a zoo is expanded: a name the installed timm or torchvision does not know
becomes a failed model of the sweep (recorded, skipped), never a crash at planning time.

Zoos:

- ``selective-paper``: the keys of the shipped model-metadata table
  (``uqvision/resources/model_metadata.csv``, :mod:`uqvision.protocols.selective.metadata`),
  the Selective paper's models of known training regime (Galil, Dabbah & El-Yaniv, 2023, "What
  Can We Learn From the Selective Prediction and Uncertainty Estimation Performance of 523
  ImageNet Classifiers?"), in file order;
- ``timm-in1k``: every ImageNet-1k classifier among timm's pretrained tags
  (:func:`is_in1k_tag`, :func:`timm_in1k`).

Adding one::

    from uqvision.zoo import ZOOS

    @ZOOS.register(name="my-zoo")
    def my_zoo() -> list[str]:
        \"\"\"ResNets I care about.\"\"\"
        return ["resnet50.a1_in1k", "resnet50.tv_in1k"]

``timm`` is imported inside the functions that need it; this module stays light (the CLI's
help lists the zoos).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable
from importlib import resources

from uqmetrics.metrics.registry import Registry

__all__ = ["IN1K_TAG", "ZOOS", "is_in1k_tag", "selective_paper", "timm_in1k", "zoo_models"]

#: Named zoos: name -> function returning model names (its docstring's first line describes it).
ZOOS: Registry[Callable[[], list[str]]] = Registry("zoo", sort=True)

#: A timm pretrained tag of ImageNet-1k weights: the tag's last dataset token is ``in1k``,
#: optionally followed by the evaluation resolution (``_384``); e.g. ``a1_in1k``,
#: ``fb_in22k_ft_in1k``, ``sw_in12k_ft_in1k_288``, ``clip_laion2b_augreg_ft_in12k_in1k_384``,
#: ``ns_jft_in1k_475``; not ``in1k_ft_in22k`` (a 21,841-class head) nor ``in1k_ijepa`` (no head).
IN1K_TAG = re.compile(r"(?:.*_)?in1k(?:_\d+)?")


def is_in1k_tag(name: str, num_classes: int | None) -> bool:
    """Whether timm model ``arch.tag`` counts as an ImageNet-1k classifier.

    Parameters
    ----------
    name : str
        ``arch.tag``.
    num_classes : int or None
        ``num_classes`` of its pretrained config.

    Returns
    -------
    bool
        The tag matches :data:`IN1K_TAG` and the head has 1000 classes.

    Examples
    --------
    >>> is_in1k_tag("convnext_tiny.fb_in22k_ft_in1k_384", 1000), is_in1k_tag("resnet50", 1000)
    (True, False)
    >>> is_in1k_tag("beitv2_base_patch16_224.in1k_ft_in22k", 21841)
    False
    """
    _, _, tag = name.partition(".")
    return bool(tag) and IN1K_TAG.fullmatch(tag) is not None and num_classes == 1000


@ZOOS.register(name="selective-paper")
def selective_paper() -> list[str]:
    """the rows of the shipped model-metadata table: the Selective paper's models of known training regime (Galil, Dabbah & El-Yaniv, 2023)"""
    text = (resources.files("uqvision") / "resources" / "model_metadata.csv").read_text("utf-8")
    rows = csv.DictReader(line for line in text.splitlines()
                          if line.strip() and not line.lstrip().startswith("#"))
    return [row["key"].strip() for row in rows]


@ZOOS.register(name="timm-in1k")
def timm_in1k() -> list[str]:
    """every ImageNet-1k classifier among timm's pretrained tags (tag ending in in1k or in1k_<size>, 1000 classes)"""
    import timm
    from timm.models import get_pretrained_cfg

    out = []
    for name in timm.list_pretrained():
        cfg = get_pretrained_cfg(name)
        if cfg is not None and is_in1k_tag(name, cfg.num_classes):
            out.append(name)
    return out


def zoo_models(zoos: Iterable[str]) -> list[str]:
    """The model names of the zoos named, in order, each name once.

    Raises
    ------
    ValueError
        An unknown zoo: ``unknown zoo 'x'; valid zoos: selective-paper, timm-in1k``.
    """
    names: dict[str, None] = {}
    for zoo in zoos:
        names.update(dict.fromkeys(ZOOS.lookup(zoo)()))
    return list(names)
