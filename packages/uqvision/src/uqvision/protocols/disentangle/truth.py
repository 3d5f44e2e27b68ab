"""The true label distributions the aleatoric task scores against (docs/conventions.md#v-8):
the ``hierarchy`` stand-in's exact ones (:func:`uqvision.hierarchy.read_label_distributions`)
and ImageNet-ReaL's label sets made distributions by the rule of Mucsányi, Kirchhof & Oh (2024),
"Benchmarking Uncertainty Disentanglement: Specialized Uncertainties for Specialized Tasks"
(:func:`real_label_distributions`).

untangle's rule for ReaL (Beyer et al. 2020, "Are we done with ImageNet?"): with the raters'
answers (``raters.npz``: per annotator and question "is image X of class Y?", its answer), an
image's weight on class ``y`` is the number of "yes" answers to its questions about ``y``; an
image no rater said yes for, but with a ReaL label set (``real.json``), has weight 1 on each
class of its set; the weights are normalised to a distribution. Without the raters' file every
labelled image is uniform on its ReaL set. An image with neither has no distribution (``valid``
False) and is left out of the aleatoric task, as untangle leaves it out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import numpy as np
from uqmetrics import InputError

__all__ = ["label_distribution_entropy", "read_truth", "real_label_distributions"]

#: ImageNet-1k's class count (ReaL's indices).
N_IMAGENET = 1000


def label_distribution_entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of ``probs`` (n, n_classes), ``0 log 0 = 0``; NaN
    for a row of zeros (no distribution)."""
    p = np.asarray(probs, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(1)
    return np.where(p.sum(1) > 0, h + 0.0, np.nan)


def _val_index(sample_id: str) -> int | None:
    """ImageNet validation index (0-based) of a sample id ``.../ILSVRC2012_val_<8 digits>.*``."""
    stem = PurePosixPath(str(sample_id)).name
    prefix, _, number = stem.partition("ILSVRC2012_val_")
    digits = number.split(".")[0]
    if prefix or len(digits) != 8 or not digits.isdigit():
        return None
    return int(digits) - 1


def real_label_distributions(real: str | os.PathLike | Sequence, sample_ids: Sequence[str], *,
                             raters: str | os.PathLike | None = None,
                             n_classes: int = N_IMAGENET) -> tuple[np.ndarray, np.ndarray]:
    """ImageNet-ReaL label sets as label distributions by untangle's rule (module docstring).

    Parameters
    ----------
    real : path or sequence
        ReaL's ``real.json`` (a list of 50,000 lists of class indices, entry ``i`` for
        ``ILSVRC2012_val_<i+1>``), or that list.
    sample_ids : sequence of str, shape (n,)
        A cache's ``sample`` coordinate (``n01440764/ILSVRC2012_val_00000293.JPEG`` or the flat
        name).
    raters : path, optional
        ReaL's ``raters.npz``: ``tensor`` (annotators, questions, answers; answer 2 is "yes")
        and ``info`` (questions, 2: file name, class index).
    n_classes : int, default 1000

    Returns
    -------
    probs : ndarray of float64, shape (n, n_classes)
        Rows summing to 1; zeros where ``valid`` is False.
    valid : ndarray of bool, shape (n,)
        Whether the image has a distribution.

    Raises
    ------
    uqmetrics.InputError
        ``real`` not a list of lists of class indices in ``[0, n_classes)``, or a raters file
        without ``tensor`` and ``info``.
    """
    if isinstance(real, (str, os.PathLike)):
        try:
            real = json.loads(Path(real).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"real must be ReaL's real.json, got {str(real)!r}: {exc}") from None
    if not isinstance(real, Sequence) or not all(isinstance(r, Sequence) for r in real):
        raise InputError("real must be a list of lists of class indices (ReaL's real.json)")
    weights: dict[int, np.ndarray] = {}
    if raters is not None:
        try:
            data = np.load(raters, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"raters must be ReaL's raters.npz (arrays without pickled "
                             f"objects), got {str(raters)!r}: {exc}") from None
        if "tensor" not in data or "info" not in data:
            raise InputError(f"raters must be ReaL's raters.npz with arrays tensor and info, got "
                             f"{str(raters)!r} with {sorted(data.files)}")
        yes = np.asarray(data["tensor"]).sum(0)[:, 2]
        for (name, label), v in zip(np.asarray(data["info"]), yes, strict=True):
            i = _val_index(str(name))
            if i is not None:
                weights.setdefault(i, np.zeros(n_classes))[int(label)] += float(v)
    n = len(sample_ids)
    probs, valid = np.zeros((n, n_classes)), np.zeros(n, bool)
    for row, sid in enumerate(sample_ids):
        i = _val_index(str(sid))
        if i is None or i >= len(real):
            continue
        w = weights.get(i)
        if w is None or w.sum() == 0:
            w = np.zeros(n_classes)
            labels = [int(c) for c in real[i]]
            if any(not 0 <= c < n_classes for c in labels):
                raise InputError(f"real entry {i} has a class index outside [0, {n_classes}): "
                                 f"{labels}")
            w[labels] = 1.0
        if w.sum() > 0:
            probs[row], valid[row] = w / w.sum(), True
    return probs, valid


def read_truth(truth: str | os.PathLike, sample_ids: Sequence[str], classes: Sequence[str], *,
               split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The true label distributions of a cache's images, in its sample and class order.

    Parameters
    ----------
    truth : path
        A ``hierarchy`` folder (its ``split``'s exact distributions) or ReaL's ``real.json``
        (:func:`real_label_distributions`, 1,000 classes).
    sample_ids, classes : sequence of str
        The cache's ``sample`` and ``class`` coordinates.
    split : str, default "test"
        The hierarchy split the images are of.

    Returns
    -------
    probs : ndarray of float64, shape (n, len(classes))
    valid : ndarray of bool, shape (n,)

    Raises
    ------
    uqmetrics.InputError
        A hierarchy image of the cache not in the split, or with probability on a class the
        cache lacks; a ``truth`` neither a hierarchy folder nor a JSON list.
    """
    path = Path(truth)
    if path.is_dir():
        from ...hierarchy import read_label_distributions

        dist = read_label_distributions(path, split)
        row = {f: i for i, f in enumerate(dist.files)}
        from ...hierarchy import read_hierarchy

        col = {c: j for j, c in enumerate(read_hierarchy(path).classes)}
        missing = [s for s in sample_ids if s not in row]
        if missing:
            raise InputError(f"truth {str(path)!r}: {len(missing)} test image(s) not in its "
                             f"{split} split, e.g. {missing[0]!r}")
        unknown = [c for c in classes if c not in col]
        if unknown:
            raise InputError(f"truth {str(path)!r}: class {unknown[0]!r} of the caches is not a "
                             "class of the hierarchy")
        full = dist.probs[[row[s] for s in sample_ids]]
        probs = full[:, [col[c] for c in classes]]
        lost = np.abs(probs.sum(1) - 1.0) > 1e-9
        if lost.any():
            raise InputError(f"truth {str(path)!r}: image {sample_ids[int(np.argmax(lost))]!r} "
                             "has label probability on classes the caches lack")
        return probs, np.ones(len(sample_ids), bool)
    if path.suffix == ".json" and path.is_file():
        probs, valid = real_label_distributions(path, sample_ids, n_classes=len(classes))
        return probs, valid
    raise InputError(f"truth must be a hierarchy folder or ReaL's real.json, got {str(truth)!r}")
