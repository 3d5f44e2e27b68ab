"""``uqvision reproduce ood``: OOD detection as OpenOOD v1.5 benchmarks it (Zhang et al. 2023;
docs/conventions.md#v-6), on the generated ``hierarchy`` stand-in.

The split of the classes (:func:`ood_split_classes`): the ID classes are most classes of each
of the first half of the superclasses; **near-OOD** are the classes held out of those same
superclasses (same pattern family and palette, another parameter setting: semantically
close); **far-OOD** are every class of the other superclasses (other families). The held-out
classes are spread inside each family's parameter range (``near_position="interior"``, the
default: each lies between two ID settings, as a near-OOD class lies between known classes),
or are its last settings (``"end"``: the network must extrapolate, and ReLU networks are then
over-confident; docs/reproduction-vision.md, V.6). The folders the
networks predict are symlink views of the generated folders (no image copied): the ID test
classes, the near and far test classes, and the fit subset: ``per_class`` images of each ID
class of the training split, drawn with ``seed``.

A deep ensemble's ``members`` and one MC-dropout network are trained on the ID classes of the
training split (``ImageTrainConfig(classes=...)``) and predict, with their penultimate
features and linear head (``PredictConfig(embeddings=True, extra_variables=("head_weight",
"head_bias"))``), the ID test view (``test``), the fit view (``fit``) and the near and far
views (eval sets ``ood-near`` / ``ood-far``). :func:`~.score.score_ood` scores every registered default detector;
the figures and findings follow.

Scales (:data:`OOD_SCALES`): ``smoke`` (tests, about 20 s on 2 cores) and ``cpu`` (the cpu
hierarchy, full-width test_resnet, 15 epochs, 5 members + MC dropout; about 15 min).

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy
    OUT/views/<set>/<class>   symlink views: test (ID), fit, near, far
    OUT/models/<run>.*        uqvision.training.loop.train_model on the ID classes
    OUT/caches/*.nc           uqvision.predict: test, fit, near, far
    OUT/ood.nc                uqvision.protocols.ood.score.score_ood
    OUT/figures/*.png         uqvision.protocols.ood.figures.draw_figures
    OUT/findings.md           uqvision.protocols.ood.findings.ood_findings

``--set`` options: ``epochs``, ``members``, ``dropout_passes`` (0: no MC-dropout network),
``per_class`` (fit images per ID class, drawn by :func:`uqvision.data.subset_choice`, as
``uqvision data subset`` draws them), ``near_per_superclass`` (held-out classes per ID
superclass), ``near_position`` (``interior`` or ``end``), ``tune_detectors`` (``true``:
OpenOOD v1.5's automatic parameter search, :attr:`~.score.OodConfig.tune_detectors`; the
networks then also predict two validation views of the generated ``val`` split: ``val``, the
ID classes, as role ``calibration``, and ``oodval``, the far-OOD classes, as role
``ood-val``, as OpenOOD's ImageNet benchmark tunes on held-out images of a far-OOD set,
OpenImage-O; the test OOD images are never tuned on).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from uqmetrics import InputError, write_dataset

from ...cache import index_caches
from ...data import subset_choice
from ...hierarchy import ensure_hierarchy, read_hierarchy
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ..base import (
    ENSEMBLE_SCALES,
    Reproduction,
    ensemble_runs,
    finish_reproduction,
    train_and_predict,
)
from . import DESCRIPTION
from .score import OodConfig, score_ood

__all__ = ["OOD_SCALES", "REPRODUCTION", "SMOKE", "ood_split_classes", "run"]

#: Where the near-OOD classes sit in each ID superclass's parameter range.
NEAR_POSITIONS = ("interior", "end")
#: Scales: name -> settings: the networks of :data:`~uqvision.protocols.base.ENSEMBLE_SCALES`
#: and the split. ``smoke``: the hierarchy smoke set (6 superclasses x 3 classes: 6 ID, 3 near,
#: 9 far classes), 10 fit images per class. ``cpu``: the cpu hierarchy (8 x 6: 16 ID, 8 near,
#: 24 far classes), 50 fit images per class.
OOD_SCALES = {
    "smoke": {**ENSEMBLE_SCALES["smoke"], "near_per_superclass": 1, "near_position": "interior",
              "per_class": 10},
    "cpu": {**ENSEMBLE_SCALES["cpu"], "near_per_superclass": 2, "near_position": "interior",
            "per_class": 50},
}
#: The smoke scale (``OOD_SCALES["smoke"]``).
SMOKE = OOD_SCALES["smoke"]
_KEYS = ("epochs", "members", "dropout_passes", "per_class", "near_per_superclass",
         "near_position", "tune_detectors")
#: ``--set tune_detectors=`` values.
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _settings(scale: str, arch: str | None, data: str | None, options: dict[str, str]) -> dict:
    if scale not in OOD_SCALES:
        raise InputError(f"reproduce ood: unknown scale {scale!r}; known: {list(OOD_SCALES)}")
    if data is not None:
        raise InputError("reproduce ood: --data is not supported (the near/far split is the "
                         "hierarchy's superclasses); predict a real ID set and OOD sets with "
                         "uqvision predict and score them with uqvision score ood")
    s = dict(OOD_SCALES[scale])
    unknown = sorted(set(options) - set(_KEYS))
    if unknown:
        raise InputError(f"--set: unknown option(s) {unknown} of reproduce ood; known: "
                         f"{list(_KEYS)}")
    s["tune_detectors"] = False
    try:
        for k, v in options.items():
            if k == "tune_detectors":
                if str(v).lower() not in _BOOLS:
                    raise ValueError(f"tune_detectors must be true or false, got {v!r}")
                s[k] = _BOOLS[str(v).lower()]
                continue
            s[k] = float(v) if k == "epochs" else str(v) if k == "near_position" else int(v)
    except ValueError as exc:
        raise InputError(f"--set: {exc}") from None
    if s["near_position"] not in NEAR_POSITIONS:
        raise InputError(f"--set near_position must be one of {list(NEAR_POSITIONS)}, got "
                         f"{s['near_position']!r}")
    if arch is not None:
        s["arch"] = arch
    return s


def ood_split_classes(root: str | os.PathLike, near_per_superclass: int = 1,
                      near_position: str = "interior") -> dict[str, list[str]]:
    """The ID, near-OOD and far-OOD classes of a generated hierarchy (module docstring).

    Parameters
    ----------
    root : path
        A folder written by :func:`uqvision.hierarchy.make_hierarchy`.
    near_per_superclass : int, default 1
        Classes held out of each ID superclass as near-OOD.
    near_position : {"interior", "end"}
        ``interior``: of a superclass's ``n`` classes (in their parameter order), those at
        positions ``floor((j + 1/2) n / k)``, ``j < k``, spread inside the range; ``end``:
        the last ``k``.

    Returns
    -------
    dict
        ``{"id": [...], "near": [...], "far": [...]}``, class folder names, sorted.

    Raises
    ------
    uqmetrics.InputError
        ``near_per_superclass`` leaves an ID superclass without ID classes.
    """
    info = read_hierarchy(root)
    ids = list(info.superclasses[:max(1, len(info.superclasses) // 2)])
    out: dict[str, list[str]] = {"id": [], "near": [], "far": []}
    for sup in info.superclasses:
        members = sorted(c for c in info.classes if info.superclass_of[c] == sup)
        if sup not in ids:
            out["far"] += members
            continue
        if not 1 <= near_per_superclass < len(members):
            raise InputError(f"near_per_superclass must be in [1, {len(members) - 1}] (a "
                             f"superclass has {len(members)} classes), got "
                             f"{near_per_superclass}")
        k = near_per_superclass
        held = (members[-k:] if near_position == "end" else
                [members[int((j + 0.5) * len(members) / k)] for j in range(k)])
        out["id"] += [m for m in members if m not in held]
        out["near"] += held
    return {k: sorted(v) for k, v in out.items()}


def _link(target: Path, link: Path) -> None:
    """A symbolic link ``link`` -> ``target`` (kept when it already points there; a link of
    an earlier run replaced; anything else there, not written here, refused)."""
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise InputError(f"{str(link)!r} is not a link this command wrote (its views are links "
                         "to the data): move it, or choose another --out")
    os.symlink(target, link, target_is_directory=target.is_dir())


def _views(root: Path, views: Path, split: dict[str, list[str]], per_class: int,
           seed: int, validation: bool = False) -> dict[str, Path]:
    """The symlink views: ``test`` (ID test classes), ``fit`` (``per_class`` seeded training
    images of each ID class), ``near``, ``far`` (test classes); with ``validation`` ``val``
    (ID classes) and ``oodval`` (far-OOD classes) of the ``val`` split."""
    out = {}
    for name, key, part in (("test", "id", "test"), ("near", "near", "test"),
                            ("far", "far", "test"),
                            *((("val", "id", "val"), ("oodval", "far", "val"))
                              if validation else ())):
        folder = views / name
        folder.mkdir(parents=True, exist_ok=True)
        for c in split[key]:
            _link((root / part / c).resolve(), folder / c)
        out[name] = folder
    fit = views / "fit"
    for c in split["id"]:
        files = sorted(p.name for p in (root / "train" / c).iterdir())
        (fit / c).mkdir(parents=True, exist_ok=True)
        for i in subset_choice([c], [(f, 0) for f in files], per_class, seed):
            _link((root / "train" / c / files[i]).resolve(), fit / c / files[i])
    out["fit"] = fit
    return out


def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
        seed: int = 0, overwrite: bool = False, options: dict | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """Run the OOD protocol at ``scale`` into ``out``; returns ``out/ood.nc``."""
    t0 = time.perf_counter()
    s = _settings(scale, arch, data, dict(options or {}))
    out = Path(out)
    root = out / "data"
    ensure_hierarchy(root, scale=s["hierarchy"], seed=seed, overwrite=overwrite)
    split = ood_split_classes(root, s["near_per_superclass"], s["near_position"])
    views = _views(root, out / "views", split, s["per_class"], seed, s["tune_detectors"])
    log(f"classes: {len(split['id'])} ID, {len(split['near'])} near, {len(split['far'])} far")

    models, caches = out / "models", out / "caches"
    models.mkdir(parents=True, exist_ok=True)
    base = {"batch_size": 256, "device": device, "seed": seed, "embeddings": True,
            "extra_variables": ("head_weight", "head_bias"), **REFERENCE_EXECUTION}

    def predict(spec: str, how: dict, trained: bool) -> int:
        n = 0
        for dataset in ("test", "fit"):  # each its role
            n += len(predict_to_files(spec, views[dataset], caches,
                                      PredictConfig(role=dataset, **how, **base),
                                      dataset_name=dataset, overwrite=trained))
        for dataset in ("near", "far"):
            n += len(predict_to_files(spec, views[dataset], caches,
                                      PredictConfig(eval_set=f"ood-{dataset}", **how, **base),
                                      dataset_name=dataset, overwrite=trained))
        if s["tune_detectors"]:  # the validation views: ID (calibration), far OOD (ood-val)
            for dataset, kind in (("val", {"role": "calibration"}),
                                  ("oodval", {"role": "ood-val", "eval_set": "ood-far"})):
                n += len(predict_to_files(spec, views[dataset], caches,
                                          PredictConfig(**kind, **how, **base),
                                          dataset_name=dataset, overwrite=trained))
        return n

    train_and_predict(ensemble_runs(s, seed, device, tag="ood", classes=tuple(split["id"])),
                      models, root / "train", predict, overwrite=overwrite, log=log)

    # the sets and the ensemble, named
    members = sorted({i.model for i in index_caches([caches]) if "deep_ensemble_s" in i.model})
    scores = score_ood(caches, OodConfig(
        test="test", fit="fit", keep_scores=True, seed=seed,
        tune_detectors=s["tune_detectors"],
        ensembles={f"deep_ensemble[{len(members)}]": members} if len(members) > 1 else None,
        fit_info={"per_class": s["per_class"], "seed": seed, "split": "train",
                  "classes": len(split["id"]), "near_position": s["near_position"]}))
    path = write_dataset(scores, out / "ood.nc", overwrite=True)
    from .figures import draw_figures  # matplotlib: imported on use
    from .findings import format_findings, ood_findings

    return finish_reproduction(out, path, t0, draw_figures(scores, out / "figures"),
                               format_findings(ood_findings(scores)), log)


#: The driver of ``uqvision reproduce ood``.
REPRODUCTION = Reproduction("ood", DESCRIPTION, run, scales=tuple(OOD_SCALES))
