"""Evaluation sets: what an image folder is to a model (its role and how its labels are made).

An :class:`EvalSet` (registry :data:`EVAL_SETS`) names a kind of evaluation folder:

- its **role** (:data:`ROLES`): ``clean`` (the model's own test distribution), ``shifted`` (the
  same classes under a distribution shift), ``ood`` (images of none of the model's classes) or
  ``relabelled`` (clean images scored against other labels, an overlay:
  :mod:`uqvision.evalsets.overlays`);
- for an OOD set, its **OOD split** (:data:`OOD_SPLITS`, OpenOOD v1.5's grouping, Zhang et
  al. 2023): ``near`` (semantic shift only: SSB-hard, NINCO), ``far`` (semantic and covariate
  shift: iNaturalist, Textures, OpenImage-O; ImageNet-O, which OpenOOD v1.5 does not use,
  is grouped with them), or ``""`` for a set of another role;
- its **class map** (:data:`CLASS_MAPS`), how the folder's classes become the model's class
  indices (:func:`map_classes`): ``by_name`` (class folders matched to the model's class
  names, :func:`uqvision.data.match_classes`), ``by_index`` (folders ``0`` ... ``N-1`` named by
  the model's class index, ImageNet-V2's layout) or ``none`` (an OOD set: every label -1);
- an optional **expansion** (:class:`Expansion`): one registered set standing for several
  folders, e.g. ImageNet-C's 15 corruptions x 5 severities, each a member
  (:class:`EvalMember`) in ``<corruption>/<severity>/`` below the set's root, extracted or in
  the archives the set ships as (:func:`resolve_member`, :func:`iter_member_folders`).

``uqvision predict --eval-set NAME`` labels the folder with the set's class map and records
the set in every cache (attrs ``eval_set``, ``role``, ``ood_split`` for an OOD set, and
``eval_member``, ``corruption``, ``severity`` for a member: :func:`eval_set_attrs`;
:func:`cache_eval_set` reads them, a cache written before them as the generic ``folder`` set,
an OOD cache written before ``ood_split`` with its registered set's split).

Besides its kind (``role``), a cache records the **role the set plays** in an evaluation
(attr ``set_role``, one of :data:`uqvision.roles.SET_ROLES`: ``calibration``, ``test``,
``fit``, ``ood-near``, ``ood-far``, ``shift``), declared by ``uqvision sweep --sets
ROLE:NAME=PATH`` or ``uqvision predict --role``, else the set's default
(:func:`default_role`): ``test`` for a clean set, ``shift`` for a shifted or relabelled one,
``ood-near``/``ood-far`` for an OOD set by its split. A cache written before roles reads with
that default (:func:`cache_eval_set`), so an old fit subset reads as a ``test`` set, and a
score command then asks which one is the test set.

The OOD sets are read as they ship: class folders or flat folders whose names are not labels
(ImageNet-O, NINCO, Textures), or OpenOOD's image lists
(``benchmark_imglist/imagenet/test_*.txt``, the ``image_list`` layout of
:mod:`uqvision.layouts`); ``ood-near`` and ``ood-far`` label any other folder near or far.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import decode_attr

from ..data.corruptions import BENCHMARK_CORRUPTIONS, check_complete
from ..layouts import is_folder
from ..roles import ROLE_ATTR, SET_ROLES

__all__ = [
    "CLASS_MAPS",
    "DEFAULT_EVAL_SET",
    "EVAL_SETS",
    "IMAGENET_C_CORRUPTIONS",
    "OOD_SPLITS",
    "ROLES",
    "EvalMember",
    "EvalSet",
    "Expansion",
    "cache_eval_set",
    "check_role",
    "default_role",
    "eval_set_attrs",
    "iter_member_folders",
    "map_classes",
    "member_dataset_name",
    "resolve_member",
]

#: Roles of an evaluation set: ``clean`` (the model's test distribution), ``shifted`` (its
#: classes under a distribution shift), ``ood`` (none of its classes), ``relabelled`` (clean
#: images scored against other labels, an :class:`~.overlays.Overlay`).
ROLES = ("clean", "shifted", "ood", "relabelled")

#: OOD splits (OpenOOD v1.5's grouping of its OOD sets): ``near`` (semantic shift only, images
#: close to the in-distribution ones), ``far`` (semantic and covariate shift); ``""``: not an
#: OOD set (an OOD set has one of the two).
OOD_SPLITS = ("near", "far", "")

#: Class maps: ``by_name`` (class folders matched to the model's class names), ``by_index``
#: (folders named ``0`` ... ``N-1``, the model's class index), ``none`` (every label -1).
CLASS_MAPS = ("by_name", "by_index", "none")

#: The evaluation set of a folder given no other (and of a cache that records none).
DEFAULT_EVAL_SET = "folder"


@dataclass(frozen=True)
class EvalMember:
    """One folder of an expanded evaluation set.

    Attributes
    ----------
    name : str
        Sub-name, e.g. ``gaussian_noise-3``.
    folder : str
        The member's folder relative to the set's root, POSIX, e.g. ``gaussian_noise/3``.
    corruption : str
        ``""`` where the member has none.
    severity : int
        0 where the member has none.
    """

    name: str
    folder: str
    corruption: str = ""
    severity: int = 0


@dataclass(frozen=True)
class Expansion:
    """A set of corruptions x severities, one member each in ``<corruption>/<severity>/``.

    Attributes
    ----------
    corruptions : tuple of str
    severities : tuple of int
    """

    corruptions: tuple[str, ...]
    severities: tuple[int, ...]

    def members(self) -> tuple[EvalMember, ...]:
        """Every member, corruption-major: ``len(corruptions) * len(severities)`` of them."""
        return tuple(EvalMember(f"{c}-{s}", f"{c}/{s}", c, int(s))
                     for c in self.corruptions for s in self.severities)


@dataclass(frozen=True)
class EvalSet:
    """A kind of evaluation folder (see the module's docstring).

    Attributes
    ----------
    name : str
        Registry name (``uqvision predict --eval-set NAME``).
    role : str
        One of :data:`ROLES`.
    class_map : str
        One of :data:`CLASS_MAPS`.
    description : str
        One line (CLI help): what the set is and its folder layout.
    expansion : Expansion or None
        The folders the set stands for (``None``: the set is one folder).
    ood_split : str
        One of :data:`OOD_SPLITS`: ``near`` or ``far`` for a set of role ``ood`` (required),
        ``""`` for the others.
    """

    name: str
    role: str
    class_map: str
    description: str
    expansion: Expansion | None = None
    ood_split: str = ""

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {list(ROLES)}, got {self.role!r}")
        if self.ood_split not in OOD_SPLITS or (self.role == "ood") != bool(self.ood_split):
            raise ValueError(f"ood_split must be 'near' or 'far' for a set of role 'ood' and "
                             f"'' for the others; eval set {self.name!r} (role {self.role!r}) "
                             f"got {self.ood_split!r}")
        if self.class_map not in CLASS_MAPS:
            raise ValueError(f"class_map must be one of {list(CLASS_MAPS)}, got "
                             f"{self.class_map!r}")

    def members(self) -> tuple[EvalMember, ...]:
        """The expansion's members (empty for a set of one folder)."""
        return () if self.expansion is None else self.expansion.members()

    def member(self, name: str) -> EvalMember:
        """The member called ``name``; ``ValueError`` naming the set and its members."""
        for m in self.members():
            if m.name == name:
                return m
        if not self.members():
            raise ValueError(f"eval set {self.name!r} has no members (it is one folder), got "
                             f"eval_member={name!r}")
        raise ValueError(f"eval set {self.name!r} has no member {name!r}; its members are "
                         f"{_some([m.name for m in self.members()])}")


#: Evaluation sets: name -> :class:`EvalSet` (``uqvision predict --eval-set NAME``; plugins:
#: entry-point group ``uqvision.eval_sets``).
EVAL_SETS: Registry[EvalSet] = Registry("eval set", group="uqvision.eval_sets", item_type=EvalSet,
                                       fill="uqvision:load_registries")

#: ImageNet-C's 15 standard corruptions (Hendrycks & Dietterich, ICLR 2019), in its order:
#: noise, blur, weather, digital (the 4 extra corruptions are not part of the benchmark); the
#: list the local generator (:mod:`uqvision.data.corruptions`) writes by default.
IMAGENET_C_CORRUPTIONS = BENCHMARK_CORRUPTIONS

for _set in (
    EvalSet(DEFAULT_EVAL_SET, "clean", "by_name",
            "an image folder of the model's classes, matched by class-folder name (the "
            "default)"),
    EvalSet("imagenet-val", "clean", "by_name",
            "ILSVRC2012 validation set: 50,000 images of the 1,000 classes in WordNet-id "
            "class folders (or flat with its label file, uqvision.layouts)"),
    EvalSet("imagenet-real", "relabelled", "by_name",
            "the ILSVRC2012 validation images (as imagenet-val) scored against the ReaL "
            "labels (Beyer et al. 2020, real.json): a set of valid labels per image, applied "
            "at scoring time as an overlay (uqvision.evalsets.real_overlay)"),
    EvalSet("imagenet-v2", "shifted", "by_index",
            "ImageNetV2 (Recht et al. 2019; matched-frequency, threshold-0.7 or top-images): "
            "10,000 images in folders 0..999 named by the ImageNet-1k class index"),
    EvalSet("imagenet-c", "shifted", "by_name",
            "ImageNet-C (Hendrycks & Dietterich 2019): the validation images under 15 "
            "corruptions x 5 severities, one member per <corruption>/<severity>/ folder of "
            "WordNet-id class folders (75 members)",
            Expansion(IMAGENET_C_CORRUPTIONS, (1, 2, 3, 4, 5))),
    EvalSet("imagenet-a", "shifted", "by_name",
            "ImageNet-A (Hendrycks et al. 2021): 7,500 natural adversarial images of 200 of "
            "the ImageNet-1k classes, WordNet-id class folders"),
    EvalSet("imagenet-r", "shifted", "by_name",
            "ImageNet-R (Hendrycks et al. 2021): 30,000 renditions (art, cartoons, sketches, "
            "...) of 200 of the ImageNet-1k classes, WordNet-id class folders"),
    EvalSet("imagenet-sketch", "shifted", "by_name",
            "ImageNet-Sketch (Wang et al. 2019): 50,889 sketches of the 1,000 classes, "
            "WordNet-id class folders"),
    EvalSet("imagenet-o", "ood", "none",
            "ImageNet-O (Hendrycks et al. 2021): 2,000 images of classes outside ImageNet-1k "
            "that fool ResNet-50s; its 200 WordNet-id folders are not labels (every label "
            "-1); far-OOD (not in OpenOOD v1.5)", ood_split="far"),
    EvalSet("ssb-hard", "ood", "none",
            "SSB-hard (Vaze et al. 2022; OpenOOD v1.5 near-OOD): 49,000 ImageNet-21k images "
            "of classes semantically close to ImageNet-1k's; class folders, or OpenOOD's "
            "list test_ssb_hard.txt (every label -1)", ood_split="near"),
    EvalSet("ninco", "ood", "none",
            "NINCO (Bitterwolf et al. 2023; OpenOOD v1.5 near-OOD): 5,879 images of 64 "
            "classes checked free of ImageNet-1k objects; class folders, or OpenOOD's list "
            "test_ninco.txt (every label -1)", ood_split="near"),
    EvalSet("inaturalist", "ood", "none",
            "iNaturalist OOD subset (Huang & Li 2021, MOS; OpenOOD v1.5 far-OOD): 10,000 "
            "plant images of 110 classes not in ImageNet-1k; a folder, or OpenOOD's list "
            "test_inaturalist.txt (every label -1)", ood_split="far"),
    EvalSet("textures", "ood", "none",
            "Textures / DTD (Cimpoi et al. 2014; OpenOOD v1.5 far-OOD): 5,640 texture images "
            "in 47 class folders, or OpenOOD's list test_textures.txt (every label -1)",
            ood_split="far"),
    EvalSet("openimage-o", "ood", "none",
            "OpenImage-O (Wang et al. 2022, ViM; OpenOOD v1.5 far-OOD): 17,632 Open Images "
            "test images of no ImageNet-1k class; a folder, or OpenOOD's list "
            "test_openimage_o.txt (every label -1)", ood_split="far"),
    EvalSet("ood-near", "ood", "none",
            "any near-OOD image folder or image list (images of other classes close to the "
            "model's; every label -1): class folders, flat, a .tar or a .txt image list",
            ood_split="near"),
    EvalSet("ood-far", "ood", "none",
            "any far-OOD image folder or image list (images of other classes unlike the "
            "model's; every label -1): class folders, flat, a .tar or a .txt image list",
            ood_split="far"),
):
    EVAL_SETS.register(_set)
del _set


def _some(names: Sequence[Any], limit: int = 8) -> str:
    """``names`` for a one-line message: at most ``limit`` of them, and how many in all."""
    names = list(names)
    shown = ", ".join(map(repr, names[:limit]))
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > limit else f"[{shown}]"


def _lookup(eval_set: EvalSet | str) -> EvalSet:
    return eval_set if isinstance(eval_set, EvalSet) else EVAL_SETS.lookup(eval_set)


# --------------------------------------------------------------------------------------------
# class maps


def map_classes(eval_set: EvalSet | str, folder_classes: Sequence[str],
                model_classes: Sequence[str] | int | None, *, folder: str,
                model: str) -> np.ndarray:
    """The model class index of each folder class under ``eval_set``'s class map.

    Parameters
    ----------
    eval_set : EvalSet or str
        The set (or its name in :data:`EVAL_SETS`).
    folder_classes : sequence of str, shape (n_folder_classes,)
        The folder's class names (sorted, as :class:`uqvision.data.ImageFolderDataset` has them).
    model_classes : sequence of str, shape (n_classes,), or int or None
        The model's class names in output order; or only their count (a model that records no
        names: enough for ``by_index`` and ``none``); ``None``: unknown (``by_index`` then
        checks only that the names are indices).
    folder, model : str
        How errors name the folder and the model.

    Returns
    -------
    ndarray of int64, shape (n_folder_classes,)
        ``by_name``: the position of each folder class among the model's names
        (:func:`uqvision.data.match_classes`); ``by_index``: ``int(name)``; ``none``: -1.

    Raises
    ------
    uqmetrics.InputError
        ``by_name``: a folder class the model lacks; ``by_index``: a folder name that is not a
        class index of the model (``0`` ... ``n_classes - 1``, no sign or leading zeros).
    ValueError
        ``by_name`` without the model's class names.

    Examples
    --------
    >>> map_classes("imagenet-v2", ["0", "2", "10"], 1000, folder="v2", model="m").tolist()
    [0, 2, 10]
    >>> map_classes("imagenet-o", ["n01443537", "n01704323"], 1000, folder="o",
    ...             model="m").tolist()
    [-1, -1]
    """
    es = _lookup(eval_set)
    folder_classes = [str(c) for c in folder_classes]
    if es.class_map == "none":
        return np.full(len(folder_classes), -1, np.int64)
    if es.class_map == "by_name":
        if model_classes is None or isinstance(model_classes, (int, np.integer)):
            raise ValueError(f"eval set {es.name!r} matches classes by name: model {model!r} "
                             "must record its class names (model_classes), got "
                             f"{model_classes!r}")
        from ..data import match_classes  # torch: imported on use (the options need none)

        return match_classes(folder_classes, model_classes, folder=folder, model=model)
    n = (None if model_classes is None else int(model_classes)
         if isinstance(model_classes, (int, np.integer)) else len(model_classes))
    bad = [c for c in folder_classes
           if not (c.isascii() and c.isdigit() and str(int(c)) == c
                   and (n is None or int(c) < n))]
    if bad:
        span = f"0 ... {n - 1}" if n is not None else "0, 1, 2, ..."
        raise InputError(
            f"image folder {folder!r} of eval set {es.name!r} (class map by_index: class "
            f"folders named by the model's class index, {span}) has {len(bad)} class "
            f"folder(s) that are not a class index of model {model!r}: {_some(bad)}")
    return np.array([int(c) for c in folder_classes], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# members and what a cache records


def resolve_member(eval_set: EvalSet | str, member: str | None,
                   root: str | os.PathLike) -> EvalMember | None:
    """The member of ``eval_set`` whose folder is ``root`` (``None`` for a set of one folder).

    Parameters
    ----------
    eval_set : EvalSet or str
    member : str or None
        The member's name, or ``None`` to find it from ``root``'s last folders (``.../fog/3``
        is ImageNet-C's ``fog-3``).
    root : path
        The folder to predict: the member's folder itself.

    Raises
    ------
    uqmetrics.InputError
        A member of a set that has none; an expanded set whose member is not given and cannot
        be told from ``root``; a member whose relative folder ``root`` does not end in; a
        member of an ImageNet-C made by ``uqvision data imagenet-c`` that is unfinished or
        lacks images of it (:func:`uqvision.data.corruptions.check_complete`).
    """
    es = _lookup(eval_set)
    if not es.members():
        if member:
            raise InputError(f"eval set {es.name!r} is one folder: it has no members, got "
                             f"eval member {member!r}")
        return None
    paths = {Path(root).absolute().parts, Path(root).resolve().parts}

    def ends_in(m: EvalMember) -> bool:
        tail = PurePosixPath(m.folder).parts
        return any(p[-len(tail):] == tail for p in paths)

    if not member:
        found = [m for m in es.members() if ends_in(m)]
        if len(found) != 1:
            raise InputError(
                f"image folder {str(root)!r} is not a member folder of eval set {es.name!r} "
                f"(<corruption>/<severity>, e.g. {es.members()[0].folder!r}): give the member "
                f"(--eval-member), one of {_some([m.name for m in es.members()])}")
        return _complete(found[0], root)
    try:
        m = es.member(member)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not ends_in(m):
        raise InputError(f"image folder {str(root)!r} is not the folder of eval set "
                         f"{es.name!r}'s member {m.name!r}: it must end in {m.folder!r}")
    return _complete(m, root)


def _complete(m: EvalMember, root: str | os.PathLike) -> EvalMember:
    """``m``, unless ``root`` is its folder in an ImageNet-C made by ``uqvision data
    imagenet-c`` that is unfinished or lacks images of it (:func:`uqvision.data.corruptions.
    check_complete`: :class:`uqmetrics.InputError` naming the member and its counts)."""
    if m.corruption:
        check_complete(Path(root).absolute().parents[len(PurePosixPath(m.folder).parts) - 1],
                       [(m.corruption, m.severity)])
    return m


def member_dataset_name(eval_set: EvalSet | str, member: EvalMember | None,
                        root: str | os.PathLike) -> str:
    """The default ``dataset_name`` of a folder: its own name, or ``<set>-<member>`` for a
    member of an expanded set (``imagenet-c-fog-3``: a member folder's own name, its severity,
    would be the same for every corruption; an image list ``test_ninco.txt``: ``test_ninco``)."""
    if member is None:
        path = Path(root).resolve()
        # an image list (OpenOOD's test_ninco.txt) is named without its extension
        return path.stem if path.suffix.lower() == ".txt" and path.is_file() else path.name
    return f"{_lookup(eval_set).name}-{member.name}"


def default_role(eval_set: EvalSet | str) -> str:
    """The role (:data:`uqvision.roles.SET_ROLES`) a set plays unless one is declared: ``test``
    for a clean set, ``shift`` for a shifted or relabelled one (ImageNet-C's members, V2,
    ReaL), ``ood-near`` or ``ood-far`` for an OOD set by its split.

    Examples
    --------
    >>> [default_role(n) for n in ("folder", "imagenet-c", "imagenet-real", "textures")]
    ['test', 'shift', 'shift', 'ood-far']
    """
    es = _lookup(eval_set)
    return {"clean": "test", "ood": f"ood-{es.ood_split}"}.get(es.role, "shift")


def _roles_of(es: EvalSet) -> tuple[str, ...]:
    """The roles a set of ``es`` may be declared with."""
    if es.role == "clean":
        return ("calibration", "test", "fit")
    return (default_role(es), "ood-val") if es.role == "ood" else (default_role(es),)


def check_role(eval_set: EvalSet | str, role: str | None, where: str = "role") -> str:
    """``role``, or the set's default (:func:`default_role`) for ``None``, checked.

    Parameters
    ----------
    eval_set : EvalSet or str
    role : str or None
        One of :data:`uqvision.roles.SET_ROLES`: ``calibration``, ``test`` or ``fit`` for a
        clean set; a shifted or relabelled set plays only its default role, an OOD set its
        default role or ``ood-val`` (an OOD validation set).
    where : str
        How the error names the value (an option and its value).

    Raises
    ------
    uqmetrics.InputError
        An unknown role, or one the set cannot play (naming those it can).
    """
    es = _lookup(eval_set)
    if role is None:
        return default_role(es)
    if role not in SET_ROLES:
        raise InputError(f"{where}: unknown role {role!r}; roles: {', '.join(SET_ROLES)}")
    if role not in _roles_of(es):
        raise InputError(f"{where}: eval set {es.name!r} (of kind {es.role}) cannot have role "
                         f"{role!r}; its roles: {', '.join(_roles_of(es))}")
    return role


def eval_set_attrs(eval_set: EvalSet | str, member: EvalMember | None,
                   role: str | None = None) -> dict[str, Any]:
    """The attrs a cache records of its evaluation set: ``eval_set``, ``role`` (its kind),
    ``set_role`` (the role it plays, ``role`` given or the set's default: :func:`check_role`),
    for an OOD set ``ood_split`` (``near`` or ``far``), and for a member ``eval_member`` and,
    where it has them, ``corruption`` and ``severity``.

    Examples
    --------
    >>> eval_set_attrs("ninco", None)
    {'eval_set': 'ninco', 'role': 'ood', 'set_role': 'ood-near', 'ood_split': 'near'}
    >>> eval_set_attrs("folder", None, "fit")["set_role"]
    'fit'
    """
    es = _lookup(eval_set)
    out: dict[str, Any] = {"eval_set": es.name, "role": es.role,
                           ROLE_ATTR: check_role(es, role)}
    if es.ood_split:
        out["ood_split"] = es.ood_split
    if member is not None:
        out["eval_member"] = member.name
        if member.corruption:
            out.update(corruption=member.corruption, severity=int(member.severity))
    return out


def cache_eval_set(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A cache's evaluation set from its attrs: ``eval_set``, ``role``, ``ood_split``
    (``""`` for none), ``set_role``, ``eval_member`` (``""`` for none), ``corruption``
    (``""``) and ``severity`` (0). A cache written before evaluation sets were recorded reads
    as the generic ``folder`` set, role ``clean``; an OOD cache written before ``ood_split``
    was recorded reads with its registered set's split (``""`` for a set not registered here),
    so a scorer can group caches into near and far OOD from their attrs alone. A cache written
    before set roles reads with its set's default role (:func:`default_role`; by its kind and
    split for a set not registered here): ``test`` for a clean set, ``shift`` for a shifted or
    relabelled one, ``ood-near``/``ood-far``."""
    a = {k: decode_attr(v) for k, v in attrs.items()}
    name = str(a.get("eval_set", DEFAULT_EVAL_SET))
    known = EVAL_SETS.get(name)
    role = a.get("role")
    if role is None:
        role = known.role if known is not None else "clean"
    split = a.get("ood_split")
    if split is None:
        split = known.ood_split if known is not None and str(role) == "ood" else ""
    set_role = a.get(ROLE_ATTR)
    if set_role is None:
        set_role = {"clean": "test", "ood": f"ood-{split}" if split else ""}.get(
            str(role), "shift")
    return {"eval_set": name, "role": str(role), "ood_split": str(split),
            "set_role": str(set_role),
            "eval_member": str(a.get("eval_member", "")),
            "corruption": str(a.get("corruption", "")), "severity": int(a.get("severity", 0))}


def iter_member_folders(root: str | os.PathLike,
                        eval_set: EvalSet | str) -> Iterator[tuple[EvalMember, Path]]:
    """``(member, folder)`` of every member of an expanded set below its root (a set of one
    folder: nothing).

    A member's folder is ``root/<corruption>/<severity>`` where that is a folder (extracted,
    or inside ``root`` when ``root`` is an archive); else, as ImageNet-C ships (``blur.tar``,
    ``noise.tar``, ...), the path to it through the first archive ``root/*.tar`` (by name)
    that holds it, ``root/blur.tar/defocus_blur/3``, read in place (:mod:`uqvision.layouts`:
    each archive is listed once); else ``root/<corruption>/<severity>``, which does not exist
    (:func:`uqvision.layouts.is_folder` tells).

    Parameters
    ----------
    root : path
        The set's root: a folder, or an archive.
    eval_set : EvalSet or str

    Raises
    ------
    uqmetrics.InputError
        An archive of ``root`` looked into that is compressed, truncated or unreadable; an
        ImageNet-C made by ``uqvision data imagenet-c`` that is unfinished or has lost images
        (:func:`uqvision.data.corruptions.check_complete`: naming the members and counts).
    """
    root = Path(root)
    check_complete(root)
    archives: list[Path] | None = None
    for m in _lookup(eval_set).members():
        folder = root / m.folder
        if not is_folder(folder):
            if archives is None:  # looked for once, and only when a member is not extracted
                archives = sorted(p for p in root.glob("*.tar") if p.is_file())
            folder = next((a / m.folder for a in archives if is_folder(a / m.folder)), folder)
        yield m, folder
