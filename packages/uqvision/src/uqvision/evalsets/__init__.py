"""Evaluation sets: what an image folder is to a model (its role and how its labels are made),
and label overlays applied at scoring time.

``uqvision predict --eval-set NAME`` labels the folder with the set's class map and records the
set in every cache; relabellings (ImageNet ReaL) are not folders but overlays keyed by sample
id, applied to a cache when it is scored.

One concern per module; every name is importable from ``uqvision.evalsets`` itself:

- :mod:`~.sets`: the evaluation sets (:class:`EvalSet`, :data:`EVAL_SETS`, roles, class maps,
  expansions and members, what a cache records of its set and the role it plays:
  :func:`default_role`, :func:`check_role`);
- :mod:`~.overlays`: the label overlays applied at scoring time (:class:`Overlay`, its files,
  ReaL's labels, :func:`apply_overlay`, :func:`overlay_correct`).
"""

from .overlays import (
    OVERLAY_KIND,
    Overlay,
    apply_overlay,
    overlay_correct,
    read_overlay,
    real_overlay,
    write_overlay,
)
from .sets import (
    CLASS_MAPS,
    DEFAULT_EVAL_SET,
    EVAL_SETS,
    IMAGENET_C_CORRUPTIONS,
    OOD_SPLITS,
    ROLES,
    EvalMember,
    EvalSet,
    Expansion,
    cache_eval_set,
    check_role,
    default_role,
    eval_set_attrs,
    iter_member_folders,
    map_classes,
    member_dataset_name,
    resolve_member,
)

__all__ = [
    "CLASS_MAPS",
    "DEFAULT_EVAL_SET",
    "EVAL_SETS",
    "IMAGENET_C_CORRUPTIONS",
    "OOD_SPLITS",
    "OVERLAY_KIND",
    "ROLES",
    "EvalMember",
    "EvalSet",
    "Expansion",
    "Overlay",
    "apply_overlay",
    "cache_eval_set",
    "check_role",
    "default_role",
    "eval_set_attrs",
    "iter_member_folders",
    "map_classes",
    "member_dataset_name",
    "overlay_correct",
    "read_overlay",
    "real_overlay",
    "resolve_member",
    "write_overlay",
]
