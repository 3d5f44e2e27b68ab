"""The ``hierarchy`` image set on disk (:mod:`uqvision.hierarchy`): its scales (:data:`SCALES`),
the class tree (superclass, role, group, palette and pattern of every class), writing it
(:func:`make_hierarchy`: every image, the mixed set, the ambiguous blends and their label
distributions, ``classes.json``) and reading it back (:func:`read_hierarchy`). How an image is
drawn is :mod:`uqvision.hierarchy.patterns`.
"""

from __future__ import annotations

import colorsys
import csv
import io
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import folder_replaced

from .patterns import AUGMENTATION, FAMILIES, _Class, _colour, _draw, _jitter, _to_uint8

__all__ = [
    "AMBIGUITY_WEIGHT_LAW",
    "AMBIGUITY_WEIGHT_LAWS",
    "FORMAT_VERSION",
    "LABEL_DISTRIBUTIONS",
    "SCALES",
    "SPLITS",
    "HierarchyInfo",
    "HierarchyScale",
    "WeightLaw",
    "class_prototypes",
    "ensure_hierarchy",
    "make_hierarchy",
    "parse_weight_law",
    "read_hierarchy",
]

#: Version of the ``classes.json`` / ``soft_labels.csv`` layout (bumped on any change). A set
#: made with ``ambiguity > 0`` adds the optional keys ``ambiguity``, ``ambiguity_weight_law``
#: and ``label_distributions``
#: and one CSV per split; a set without them is read as ``ambiguity = 0`` (every label one-hot),
#: so the default output, and every set written before, stays version 1 byte for byte.
FORMAT_VERSION = 1
#: The ImageFolder splits, in the order they are generated, and the soft-label split.
SPLITS = ("train", "val", "test")
MIXED = "mixed"
#: The per-split file of label distributions of a set made with ``ambiguity > 0``
#: (``<split>/label_distributions.csv``; columns as ``mixed/soft_labels.csv``).
LABEL_DISTRIBUTIONS = "label_distributions.csv"
#: The default law of a blended slot's weight alpha (of its own class), as ``classes.json``
#: records it (key ``ambiguity_weight_law``) in a set made with ``ambiguity > 0``
#: (:data:`AMBIGUITY_WEIGHT_LAWS`, ``weight_law=``).
AMBIGUITY_WEIGHT_LAW = "uniform(0, 1)"
_SPLIT_CODES = {"train": 1, "val": 2, "test": 3, MIXED: 4}
_FORMAT = "uqvision.hierarchy"


@dataclass(frozen=True)
class WeightLaw:
    """A law of the weight alpha of a blended image (:data:`AMBIGUITY_WEIGHT_LAWS`).

    Attributes
    ----------
    params : tuple of str
        The names of its parameters, in the order a law's text gives them (``beta(a, b)``).
    draw : callable
        ``draw(rng, params) -> float`` in [0, 1]: one weight from the slot's own stream.
    shown : tuple of float
        The parameters its text shows when it takes none (``uniform(0, 1)``).
    description : str
    """

    params: tuple[str, ...]
    draw: Callable[[np.random.Generator, tuple[float, ...]], float]
    shown: tuple[float, ...] = ()
    description: str = ""

    def text(self, name: str, params: tuple[float, ...]) -> str:
        """The law as ``classes.json`` records it, e.g. ``uniform(0, 1)``, ``beta(2, 5)``."""
        return f"{name}({', '.join(_number(x) for x in params or self.shown)})"


def _number(x: float) -> str:
    """``2`` for 2.0, ``0.5`` for 0.5: the shortest text that reads back as the same float."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


#: The laws of the weight alpha of a blended image (``make_hierarchy(weight_law=...)``,
#: ``uqvision data hierarchy --weight-law``): ``uniform``, alpha ~ U(0, 1) (the default), and
#: ``beta(a, b)``, alpha ~ Beta(a, b) with a, b > 0. Each draws from the slot's own stream at
#: the place of the default's U(0, 1) draw.
AMBIGUITY_WEIGHT_LAWS: Registry[WeightLaw] = Registry("weight law")
AMBIGUITY_WEIGHT_LAWS.add("uniform", WeightLaw(
    (), lambda rng, p: float(rng.uniform()), shown=(0, 1),
    description="alpha ~ U(0, 1) (the default)"))
AMBIGUITY_WEIGHT_LAWS.add("beta", WeightLaw(
    ("a", "b"), lambda rng, p: float(rng.beta(p[0], p[1])),
    description="alpha ~ Beta(a, b), a > 0 and b > 0 (numpy's Generator.beta)"))
_LAW_TEXT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*")


def parse_weight_law(spec: str) -> tuple[str, tuple[float, ...]]:
    """A weight law's text (``uniform``, ``beta(2, 5)``, or a law as ``classes.json`` records
    it, e.g. ``uniform(0, 1)``) -> ``(name, parameters)``.

    Raises
    ------
    uqmetrics.InputError
        Not a law of :data:`AMBIGUITY_WEIGHT_LAWS` (listing them), or parameters that are not
        the law's: their number, a value not a positive finite number (``beta``), or anything
        but none or ``(0, 1)`` for ``uniform``; each naming ``weight_law`` (``--weight-law``)
        and the text given.

    Examples
    --------
    >>> parse_weight_law("uniform"), parse_weight_law("beta(2, 0.5)")
    (('uniform', ()), ('beta', (2.0, 0.5)))
    """
    where = f"weight_law (--weight-law) {spec!r}"
    m = _LAW_TEXT.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise InputError(f"{where}: not a weight law; give NAME or NAME(p1, p2), one of "
                         f"{_laws_listed()}")
    name, inner = m.group(1), m.group(2)
    if name not in AMBIGUITY_WEIGHT_LAWS:
        raise InputError(f"{where}: unknown weight law {name!r}; known: {_laws_listed()}")
    law = AMBIGUITY_WEIGHT_LAWS[name]
    try:
        params = tuple(float(t) for t in inner.split(",")) if inner and inner.strip() else ()
    except ValueError:
        raise InputError(f"{where}: the parameters must be numbers, got ({inner})") from None
    if not law.params:
        if params not in ((), tuple(float(x) for x in law.shown)):
            raise InputError(f"{where}: {name} takes no parameters (or those it is recorded "
                             f"with: {law.text(name, ())}), got ({inner.strip()})")
        return name, ()
    if len(params) != len(law.params):
        raise InputError(f"{where}: {name} takes {len(law.params)} parameters "
                         f"({', '.join(law.params)}), got {len(params)}")
    for p, x in zip(law.params, params, strict=True):
        if not (math.isfinite(x) and x > 0):
            raise InputError(f"{where}: {p} must be a positive finite number, got "
                             f"{_number(x) if math.isfinite(x) else x}")
    return name, params


def _laws_listed() -> str:
    return ", ".join(f"{n}({', '.join(w.params)})" if w.params else n
                     for n, w in AMBIGUITY_WEIGHT_LAWS.items())


# --------------------------------------------------------------------------------------------
# sizes

@dataclass(frozen=True)
class HierarchyScale:
    """Sizes of one scale of the data set (counts are per class).

    Parameters
    ----------
    name : str
    description : str
    superclasses : int
        Number of superclasses (pattern families); at most ``len(FAMILIES)``.
    classes_per_superclass : int
        Classes (parameter settings) per family, at least 2 (a mixed image blends two).
    train, val, test : int
        Images per class in each ImageFolder split.
    mixed : int
        Mixed images per class, counted by the class of larger weight (the folder it is filed in).
    downstream_groups : int
        Downstream stand-in datasets the second half of the superclasses is split into (>= 2).
    image_size : int
        Side of the square RGB images in pixels.
    """

    name: str
    description: str
    superclasses: int
    classes_per_superclass: int
    train: int
    val: int
    test: int
    mixed: int
    downstream_groups: int = 2
    image_size: int = 32

    def __post_init__(self):
        for key in ("train", "val", "test", "mixed", "image_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        if not 2 <= self.superclasses <= len(FAMILIES):
            raise ValueError(f"superclasses must be in [2, {len(FAMILIES)}] (one pattern family "
                             f"each), got {self.superclasses!r}")
        if self.classes_per_superclass < 2:
            raise ValueError("classes_per_superclass must be >= 2, got "
                             f"{self.classes_per_superclass!r}")
        n_down = self.superclasses - self.superclasses // 2
        if not 2 <= self.downstream_groups <= n_down:
            raise ValueError(f"downstream_groups must be in [2, {n_down}] (whole downstream "
                             f"superclasses per group), got {self.downstream_groups!r}")

    @property
    def n_classes(self) -> int:
        """Total number of classes."""
        return self.superclasses * self.classes_per_superclass


#: The scales: name -> :class:`HierarchyScale`.
SCALES: Registry[HierarchyScale] = Registry("hierarchy scale")


SCALES.add("smoke", HierarchyScale(
    "smoke", "unit tests: 6 superclasses x 3 classes, 16/4/8 images per class (seconds)",
    superclasses=6, classes_per_superclass=3, train=16, val=4, test=8, mixed=2))
SCALES.add("cpu", HierarchyScale(
    "cpu", "default: 8 superclasses x 6 classes, 100/20/40 images per class",
    superclasses=8, classes_per_superclass=6, train=100, val=20, test=40, mixed=8))


# --------------------------------------------------------------------------------------------
# the class tree

def _group_name(g: int) -> str:
    return "down_" + "abcdefghijklmnopqrstuvwxyz"[g]


def _class_tree(scale: HierarchyScale, seed: int) -> list[_Class]:
    """The classes in index order, with their role, group, palette and pattern."""
    n_up = scale.superclasses // 2
    down_groups = np.array_split(np.arange(n_up, scale.superclasses), scale.downstream_groups)
    group_of = {int(s): _group_name(g) for g, ss in enumerate(down_groups) for s in ss}
    hue0 = np.random.default_rng([seed, 0]).uniform()
    classes = []
    for s, family in enumerate(FAMILIES.names()[:scale.superclasses]):
        hue = (hue0 + s / scale.superclasses) % 1.0
        fg = colorsys.hsv_to_rgb(hue, 0.75, 0.95)
        bg = colorsys.hsv_to_rgb((hue + 0.08) % 1.0, 0.65, 0.28)
        superclass = f"{s:02d}-{family}"
        for k in range(scale.classes_per_superclass):
            rng = np.random.default_rng([seed, 1, s])  # the family's layout
            classes.append(_Class(
                f"{superclass}-{k:02d}", superclass, family, k,
                "upstream" if s < n_up else "downstream", group_of.get(s), fg, bg,
                FAMILIES[family](k, scale.classes_per_superclass, rng)))
    return classes



def _rng(seed: int, split: str, cls: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_CODES[split], cls, index])


def _image(c: _Class, rng: np.random.Generator, size: int) -> np.ndarray:
    d = _draw(rng, size)
    return _to_uint8(_jitter(_colour(c, size, d), d))


def _mixed_draw(seed: int, cls: int, index: int, size: int, per_superclass: int):
    """The ``index``-th mixed image filed under class ``cls`` (its majority class).

    The partner is another class of the same superclass; the majority weight is U(0.5, 1) and
    the order of the pair is a fair coin, so ``alpha`` (weight of ``class_a``) is U(0, 1).
    Returns ``(class_a, class_b, alpha, draw)``.
    """
    rng = _rng(seed, MIXED, cls, index)
    first = cls - cls % per_superclass
    partner = first + (cls - first + rng.integers(1, per_superclass)) % per_superclass
    weight = round(float(rng.uniform(0.5, 1.0)), 6)
    a, b, alpha = (cls, int(partner), weight) if rng.integers(2) else (int(partner), cls,
                                                                       round(1 - weight, 6))
    return a, b, alpha, _draw(rng, size)


@dataclass(frozen=True)
class _Ambiguity:
    """The ambiguity draw of a blended slot: ``class_a`` (the slot's class) and ``class_b``
    blended with ``alpha`` the weight of ``class_a``, and the drawn ``label``."""

    class_a: int
    class_b: int
    alpha: float
    label: int


def _n_blended(n: int, ambiguity: float) -> int:
    """Blended slots per class of a split of ``n`` per class: ``floor(ambiguity * n + 1/2)``."""
    return math.floor(ambiguity * n + 0.5)


def _ambiguity_draw(rng: np.random.Generator, cls: int, per_superclass: int,
                    law: tuple[str, tuple[float, ...]] = ("uniform", ())) -> _Ambiguity:
    """The label-ambiguity draw of slot class ``cls``, from the slot's own stream ``rng`` after
    its image draw (:func:`~uqvision.hierarchy.patterns._draw`), so the plain images' pixels
    do not change: the partner ``class_b`` uniform over the other classes of the superclass,
    then ``alpha`` from the weight ``law`` (``(name, parameters)`` of
    :data:`AMBIGUITY_WEIGHT_LAWS`; default U(0, 1); rounded to 6 decimals: the value used and
    recorded), then the label: ``class_a`` if ``U(0, 1) < alpha`` else ``class_b``."""
    first = cls - cls % per_superclass
    partner = first + (cls - first + int(rng.integers(1, per_superclass))) % per_superclass
    alpha = round(AMBIGUITY_WEIGHT_LAWS[law[0]].draw(rng, law[1]), 6)
    label = cls if rng.uniform() < alpha else partner
    return _Ambiguity(cls, int(partner), alpha, int(label))


def _mixed_image(classes, a, b, alpha, d, size) -> np.ndarray:
    x = alpha * _colour(classes[a], size, d) + (1 - alpha) * _colour(classes[b], size, d)
    return _to_uint8(_jitter(x, d))


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def class_prototypes(scale: str = "cpu", *, seed: int = 0) -> np.ndarray:
    """Every class's prototype: its pattern in its palette, untransformed and noise-free.

    Parameters
    ----------
    scale : str
        A name in :data:`SCALES`.
    seed : int

    Returns
    -------
    numpy.ndarray, shape (n_classes, image_size, image_size, 3), float in [0, 1]
        In class index order (sorted class names).
    """
    sc = _check_args(scale, seed)
    return np.stack([_colour(c, sc.image_size, None) for c in _class_tree(sc, seed)])


# --------------------------------------------------------------------------------------------
# writing

def _check_args(scale, seed) -> HierarchyScale:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return SCALES.lookup(scale)


def _check_ambiguity(ambiguity) -> float:
    if isinstance(ambiguity, bool) or not isinstance(ambiguity, (int, float, np.integer,
                                                                 np.floating)) \
            or not 0.0 <= float(ambiguity) <= 1.0:
        raise InputError(f"ambiguity must be a fraction in [0, 1], got {ambiguity!r}")
    return float(ambiguity)


def _check_blends(ambiguity, weight_law) -> tuple[float, tuple[str, tuple[float, ...]]]:
    """``(ambiguity, parsed weight law)``, checked: a law other than ``uniform`` needs
    ``ambiguity > 0``."""
    ambiguity = _check_ambiguity(ambiguity)
    law = parse_weight_law(weight_law)
    if ambiguity == 0 and law[0] != "uniform":
        raise InputError(f"weight_law (--weight-law) {weight_law!r} needs ambiguity > 0 "
                         "(--ambiguity F): without blended images no weight is drawn")
    return ambiguity, law


def make_hierarchy(out: str | os.PathLike, *, scale: str = "cpu", seed: int = 0,
                   overwrite: bool = False, ambiguity: float = 0.0,
                   weight_law: str = "uniform") -> Path:
    """Generate the ``hierarchy`` image set into the folder ``out`` (docs/conventions.md#v-0).

    Parameters
    ----------
    out : str or path-like
        Target folder; written atomically (a temporary folder beside it, renamed at the end).
    scale : str, default "cpu"
        A name in :data:`SCALES` (``smoke``: unit tests, seconds; ``cpu``: 48 classes).
    seed : int, default 0
        Every byte written is a function of ``(scale, seed)``.
    overwrite : bool, default False
        Replace an existing non-empty ``out``; otherwise that raises ``ValueError``. Only a
        folder the dataset makers wrote, holding nothing else, is replaced
        (:func:`uqmetrics.runs.io.folder_replaced`; else :class:`uqmetrics.InputError`).
    ambiguity : float, default 0
        Fraction in [0, 1] of each class's train/val/test images that blend two classes of one
        superclass with weight alpha (drawn from ``weight_law``, default U(0, 1)) and are
        labelled by a draw from (alpha, 1 - alpha); each split then gets ``label_distributions.csv`` (the exact label
        distribution of every image; read it with
        :func:`~uqvision.hierarchy.read_label_distributions`). 0 writes the set without
        ambiguity, byte for byte as before this option (docs/conventions.md#v-0).
    weight_law : str, default "uniform"
        The law of the blend weight alpha (:data:`AMBIGUITY_WEIGHT_LAWS`): ``uniform``
        (U(0, 1)) or ``beta(a, b)`` (Beta(a, b), a, b > 0), e.g. ``beta(2, 5)``; recorded in
        ``classes.json`` as ``ambiguity_weight_law`` (``uniform(0, 1)``, ``beta(2, 5)``). Only
        with ``ambiguity > 0``.

    Returns
    -------
    Path
        ``out``; read it with :func:`read_hierarchy`.

    Raises
    ------
    ValueError
        Unknown ``scale``, a negative or non-integer ``seed``, or ``out`` exists (a file, or a
        non-empty folder) and ``overwrite`` is False.
    uqmetrics.InputError
        ``ambiguity`` not a number in [0, 1]; ``weight_law`` not a law of
        :data:`AMBIGUITY_WEIGHT_LAWS` or with parameters that are not its own
        (:func:`parse_weight_law`), or other than ``uniform`` with ``ambiguity = 0`` (no image
        would draw from it).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     info = read_hierarchy(make_hierarchy(Path(tmp) / "h", scale="smoke", seed=0))
    >>> len(info.classes), len(info.superclasses), sorted(info.downstream_groups)
    (18, 6, ['down_a', 'down_b'])
    """
    sc = _check_args(scale, seed)
    ambiguity, law = _check_blends(ambiguity, weight_law)
    seed = int(seed)
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not overwrite \
            and not (out.is_dir() and not any(out.iterdir())):
        raise ValueError(f"out {str(out)!r} already exists; pass overwrite=True to replace it")
    with folder_replaced(out, writer="uqvision data", also=("data.config.toml",)) as tmp:
        # --overwrite: only a folder of the makers (uqvision.data.makers)
        _write(tmp, sc, seed, ambiguity, law)
    return out


def _write(root: Path, sc: HierarchyScale, seed: int, ambiguity: float = 0.0,
           law: tuple[str, tuple[float, ...]] = ("uniform", ())) -> None:
    classes = _class_tree(sc, seed)
    size = sc.image_size
    for split in SPLITS:
        n = getattr(sc, split)
        if ambiguity > 0:
            _write_ambiguous_split(root / split, classes, sc, seed, split, ambiguity, law)
            continue
        for i, c in enumerate(classes):
            d = root / split / c.name
            d.mkdir(parents=True)
            for j in range(n):
                (d / f"{j:05d}.png").write_bytes(_png(_image(c, _rng(seed, split, i, j), size)))
    rows: list[tuple[str, str, str, str]] = []
    for i, c in enumerate(classes):
        d = root / MIXED / c.name
        d.mkdir(parents=True)
        for j in range(sc.mixed):
            a, b, alpha, draw = _mixed_draw(seed, i, j, size, sc.classes_per_superclass)
            (d / f"{j:05d}.png").write_bytes(_png(_mixed_image(classes, a, b, alpha, draw, size)))
            rows.append((f"{c.name}/{j:05d}.png", classes[a].name, classes[b].name, f"{alpha:.6f}"))
    _write_csv(root / MIXED / "soft_labels.csv", rows)
    groups: dict[str, list[str]] = {}
    for c in classes:
        if c.group is not None:
            groups.setdefault(c.group, []).append(c.name)
    meta = {
        "format": _FORMAT,
        "format_version": FORMAT_VERSION,
        "scale": asdict(sc),
        "seed": seed,
        "augmentation": asdict(AUGMENTATION),
        "splits": {s: getattr(sc, s) for s in (*SPLITS, MIXED)},
        "soft_labels": f"{MIXED}/soft_labels.csv",
        **({"ambiguity": ambiguity,
            "ambiguity_weight_law": AMBIGUITY_WEIGHT_LAWS[law[0]].text(*law),
            "label_distributions": {s: f"{s}/{LABEL_DISTRIBUTIONS}" for s in SPLITS}}
           if ambiguity > 0 else {}),  # absent: ambiguity 0 (the default's bytes unchanged)
        "superclasses": list(dict.fromkeys(c.superclass for c in classes)),
        "downstream_groups": groups,
        "classes": [{"name": c.name, "superclass": c.superclass, "family": c.family,
                     "setting": c.k, "role": c.role, "group": c.group,
                     "palette": {"foreground": [round(x, 6) for x in c.fg],
                                 "background": [round(x, 6) for x in c.bg]}}
                    for c in classes],
    }
    (root / "classes.json").write_text(json.dumps(meta, indent=1) + "\n")


def _write_csv(path: Path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("file", "class_a", "class_b", "alpha"))
        w.writerows(rows)


def _write_ambiguous_split(root: Path, classes, sc: HierarchyScale, seed: int, split: str,
                           ambiguity: float,
                           law: tuple[str, tuple[float, ...]] = ("uniform", ())) -> None:
    """One split of a set with label ambiguity: slot ``(class i, index j)`` draws its image as
    always; the first ``floor(ambiguity * n + 1/2)`` slots of every class are blends instead
    (:func:`_ambiguity_draw`, alpha from the weight ``law``), filed under their drawn label
    as ``blend-<iii>-<jjjjj>.png``;
    the rest are the plain images ``<jjjjj>.png``. ``label_distributions.csv`` lists every
    image: a plain one as ``(class, class, 1)``, a blend as ``(class_a, class_b, alpha)``."""
    size, n = sc.image_size, getattr(sc, split)
    k = _n_blended(n, ambiguity)
    rows = []
    for c in classes:
        (root / c.name).mkdir(parents=True)
    for i, c in enumerate(classes):
        for j in range(n):
            rng = _rng(seed, split, i, j)
            draw = _draw(rng, size)
            if j >= k:
                rel = f"{c.name}/{j:05d}.png"
                arr = _to_uint8(_jitter(_colour(c, size, draw), draw))
                rows.append((rel, c.name, c.name, f"{1.0:.6f}"))
            else:
                amb = _ambiguity_draw(rng, i, sc.classes_per_superclass, law)
                rel = f"{classes[amb.label].name}/blend-{i:03d}-{j:05d}.png"
                arr = _mixed_image(classes, amb.class_a, amb.class_b, amb.alpha, draw, size)
                rows.append((rel, c.name, classes[amb.class_b].name, f"{amb.alpha:.6f}"))
            (root / rel).write_bytes(_png(arr))
    _write_csv(root / LABEL_DISTRIBUTIONS, sorted(rows))


# --------------------------------------------------------------------------------------------
# reading

@dataclass(frozen=True, eq=False)
class HierarchyInfo:
    """What :func:`read_hierarchy` returns: the class tree, roles, split folders, soft labels.

    Attributes
    ----------
    root : Path
    scale : str
    seed : int
    format_version : int
    classes : tuple of str, shape (n_classes,)
        Class names in class-index order (sorted, = ImageFolder order).
    superclasses : tuple of str, shape (n_superclasses,)
    superclass_of : dict
        class -> superclass.
    roles : dict
        class -> ``"upstream"`` or ``"downstream"``.
    downstream_groups : dict
        group name -> tuple of its classes (whole superclasses, never seen upstream).
    splits : dict
        ``train``/``val``/``test``/``mixed`` -> folder.
    mixed_files : tuple of str, shape (n_mixed,)
        Sample ids of the mixed set (paths relative to ``splits["mixed"]``), sorted: the order
        of :class:`uqvision.data.ImageFolderDataset` over that folder.
    mixed_pairs : numpy.ndarray of int, shape (n_mixed, 2)
        Class indices ``(class_a, class_b)`` blended in each mixed image.
    mixed_alpha : numpy.ndarray of float, shape (n_mixed,)
        Weight of ``class_a``; the label distribution is ``(alpha, 1 - alpha)``.
    meta : dict
        The parsed ``classes.json``.
    """

    root: Path
    scale: str
    seed: int
    format_version: int
    classes: tuple[str, ...]
    superclasses: tuple[str, ...]
    superclass_of: dict[str, str]
    roles: dict[str, str]
    downstream_groups: dict[str, tuple[str, ...]]
    splits: dict[str, Path]
    mixed_files: tuple[str, ...]
    mixed_pairs: np.ndarray
    mixed_alpha: np.ndarray
    meta: dict = field(repr=False)

    @property
    def superclass_index(self) -> np.ndarray:
        """Superclass index of every class, shape (n_classes,)."""
        pos = {s: i for i, s in enumerate(self.superclasses)}
        return np.array([pos[self.superclass_of[c]] for c in self.classes])

    @property
    def ambiguity(self) -> float:
        """Fraction of blended, label-drawn images per class of train/val/test (``make_hierarchy(
        ambiguity=)``; 0 for a set without the key: every label one-hot)."""
        return float(self.meta.get("ambiguity", 0.0))

    @property
    def upstream_classes(self) -> tuple[str, ...]:
        """Classes with role ``upstream``, in class order."""
        return tuple(c for c in self.classes if self.roles[c] == "upstream")

    @property
    def soft_labels(self) -> np.ndarray:
        """Label distribution of every mixed image, shape (n_mixed, n_classes); rows sum to 1."""
        p = np.zeros((len(self.mixed_files), len(self.classes)))
        rows = np.arange(len(self.mixed_files))
        p[rows, self.mixed_pairs[:, 0]] += self.mixed_alpha
        p[rows, self.mixed_pairs[:, 1]] += 1 - self.mixed_alpha
        return p


def read_hierarchy(root: str | os.PathLike) -> HierarchyInfo:
    """Read the ``classes.json`` and soft labels of a folder written by :func:`make_hierarchy`.

    Parameters
    ----------
    root : str or path-like

    Returns
    -------
    HierarchyInfo

    Raises
    ------
    FileNotFoundError
        ``root`` has no ``classes.json``.
    ValueError
        ``classes.json`` is not a hierarchy file of a format version this code reads.
    """
    root = Path(root)
    path = root / "classes.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(root)!r} has no classes.json (not a hierarchy folder)")
    meta = json.loads(path.read_text())
    if meta.get("format") != _FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{str(path)!r}: format {meta.get('format')!r} version "
                         f"{meta.get('format_version')!r}; expected {_FORMAT!r} "
                         f"version {FORMAT_VERSION}")
    entries = meta["classes"]
    classes = tuple(e["name"] for e in entries)
    index = {c: i for i, c in enumerate(classes)}
    with open(root / meta["soft_labels"], newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["file"])
    return HierarchyInfo(
        root=root,
        scale=meta["scale"]["name"],
        seed=meta["seed"],
        format_version=meta["format_version"],
        classes=classes,
        superclasses=tuple(meta["superclasses"]),
        superclass_of={e["name"]: e["superclass"] for e in entries},
        roles={e["name"]: e["role"] for e in entries},
        downstream_groups={g: tuple(cs) for g, cs in meta["downstream_groups"].items()},
        splits={s: root / s for s in (*SPLITS, MIXED)},
        mixed_files=tuple(r["file"] for r in rows),
        mixed_pairs=np.array([[index[r["class_a"]], index[r["class_b"]]] for r in rows],
                             dtype=np.int64).reshape(-1, 2),
        mixed_alpha=np.array([float(r["alpha"]) for r in rows]),
        meta=meta,
    )


def _made_with(info: HierarchyInfo) -> tuple:
    """``(scale, seed, ambiguity, weight law)`` a folder was made with, the law ``None``
    without ambiguity (no blend drawn)."""
    law = (parse_weight_law(info.meta.get("ambiguity_weight_law", AMBIGUITY_WEIGHT_LAW))
           if info.ambiguity > 0 else None)
    return info.scale, info.seed, info.ambiguity, law


def ensure_hierarchy(root: str | os.PathLike, *, scale: str, seed: int, overwrite: bool = False,
                     ambiguity: float = 0.0, weight_law: str = "uniform") -> HierarchyInfo:
    """The ``hierarchy`` set a reproduction runs on, in ``root``, as the run asks for it.

    Made by :func:`make_hierarchy` when ``root`` holds none; kept when its ``classes.json``
    says it was made with this ``scale``, ``seed``, ``ambiguity`` and ``weight_law``; made
    again when it was made otherwise and ``overwrite`` is true. Otherwise an error: a rerun
    into the same folder with another scale, seed or ambiguity would else train and score on
    the set of the earlier run while recording the options of this one.

    Parameters
    ----------
    root : str or path-like
    scale, seed, ambiguity, weight_law
        As :func:`make_hierarchy`.
    overwrite : bool, default False
        Replace a set made otherwise (the command's ``--overwrite``).

    Returns
    -------
    HierarchyInfo

    Raises
    ------
    ValueError
        ``root`` holds a set made otherwise and ``overwrite`` is false; naming the folder,
        what it holds and what the run needs.
    """
    root = Path(root)
    _check_args(scale, seed)
    ambiguity, law = _check_blends(ambiguity, weight_law)
    want = (scale, int(seed), ambiguity, law if ambiguity > 0 else None)
    if (root / "classes.json").is_file():
        info = read_hierarchy(root)
        have = _made_with(info)
        if have == want:
            return info
        if not overwrite:
            def said(m):
                law = f", weight law {m[3][0]}{m[3][1] or ''}" if m[3] else ""
                return f"scale {m[0]!r}, seed {m[1]}, ambiguity {m[2]:g}{law}"
            raise ValueError(f"{str(root)!r} holds the hierarchy set of {said(have)}; this run "
                             f"needs {said(want)}: pass --overwrite to replace it (with what "
                             "was computed from it) or choose another --out")
    return read_hierarchy(make_hierarchy(root, scale=scale, seed=seed, overwrite=root.exists(),
                                         ambiguity=ambiguity, weight_law=weight_law))
