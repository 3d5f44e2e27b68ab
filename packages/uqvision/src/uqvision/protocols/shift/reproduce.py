"""``uqvision reproduce shift``: predictive uncertainty under dataset shift (Ovadia et al.
2019; docs/conventions.md#v-5), first version: smoke scale only.

A small deep ensemble's members are trained on the generated ``hierarchy`` stand-in (or a real
image folder, ``--data ROOT --arch NAME``: ``ROOT/train``, ``ROOT/val``, ``ROOT/test``), its
test split is corrupted as ImageNet-C is (:func:`uqvision.data.corruptions.make_corrupted_folder`,
a few cheap corruptions at severities 1, 3, 5), and every member predicts the clean
validation and test folders and every corrupted member folder (eval set ``imagenet-c``); the
caches are scored by :func:`~.score.score_shift` with the first member as the mCE baseline.

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy (not with --data)
    OUT/data-c/<c>/<s>/       make_corrupted_folder of the test split
    OUT/models/<run>.*        uqvision.training.loop.train_model
    OUT/caches/*.nc           uqvision.predict: val, test and every corrupted member
    OUT/shift.nc              uqvision.protocols.shift.score.score_shift

``--set`` options: ``epochs``, ``members``, ``corruptions`` (comma-separated),
``severities`` (comma-separated), ``calibration_size``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from uqmetrics import InputError, write_dataset

from ...cache import index_caches
from ...data import check_split_classes
from ...data.corruptions import make_corrupted_folder
from ...evalsets import iter_member_folders
from ...hierarchy import make_hierarchy
from ...models import read_sidecar
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ...training.loop import ImageTrainConfig, train_model
from ..base import Reproduction
from . import DESCRIPTION
from .score import ShiftConfig, score_shift

__all__ = ["REPRODUCTION", "SMOKE", "run"]

#: The smoke scale: the hierarchy set, a half-width timm test_resnet, two members of three epochs,
#: three cheap corruptions at severities 1, 3, 5 (well under a minute on 2 cores).
SMOKE = {"hierarchy": "smoke", "arch": "test_resnet", "epochs": 3.0, "members": 2,
         "batch_size": 32, "input_size": 32, "model_kwargs": {"channels": [16, 24, 24, 48]},
         "corruptions": ("gaussian_noise", "contrast", "pixelate"), "severities": (1, 3, 5),
         "calibration_size": 0.5}
_KEYS = ("epochs", "members", "corruptions", "severities", "calibration_size")


def _settings(arch: str | None, data: str | None, options: dict[str, str]) -> dict:
    s = dict(SMOKE)
    unknown = sorted(set(options) - set(_KEYS))
    if unknown:
        raise InputError(f"--set: unknown option(s) {unknown} of reproduce shift; known: "
                         f"{list(_KEYS)}")
    try:
        for k, v in options.items():
            if k in ("corruptions",):
                s[k] = tuple(x.strip() for x in str(v).split(",") if x.strip())
            elif k == "severities":
                s[k] = tuple(int(x) for x in str(v).split(","))
            elif k == "members":
                s[k] = int(v)
            else:
                s[k] = float(v)
    except ValueError as exc:
        raise InputError(f"--set: {exc}") from None
    if arch is not None:
        s["arch"] = arch
    if data is not None:
        s["model_kwargs"] = {}
    return s


def _done(ckpt: Path, config: ImageTrainConfig) -> bool:
    return ckpt.is_file() and read_sidecar(ckpt).get("train_config") == json.loads(
        json.dumps(asdict(config)))


def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
        seed: int = 0, overwrite: bool = False, options: dict | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """Run the shift protocol at ``scale`` into ``out``; returns ``out/shift.nc``."""
    if scale != "smoke":
        raise InputError(f"reproduce shift knows scale 'smoke' only, got {scale!r}")
    t0 = time.perf_counter()
    s = _settings(arch, data, dict(options or {}))
    out = Path(out)
    if data is None:
        root = out / "data"
        if not (root / "classes.json").is_file():
            make_hierarchy(root, scale=s["hierarchy"], seed=seed, overwrite=root.exists())
    else:
        root = Path(data)
    train, val, test = root / "train", root / "val", root / "test"
    for p in (train, val, test):
        if not p.is_dir():
            raise FileNotFoundError(f"{str(p)!r} does not exist (need ROOT/train, ROOT/val and "
                                    "ROOT/test)")
    check_split_classes(train, {"val": val, "test": test}, same=("val",))
    corrupted = make_corrupted_folder(
        test, out / "data-c", corruptions=s["corruptions"], severities=s["severities"],
        resize=s["input_size"], crop=s["input_size"], seed=seed, progress=False,
        overwrite=overwrite)
    log(f"corrupted test split: {corrupted}")

    models, caches = out / "models", out / "caches"
    models.mkdir(parents=True, exist_ok=True)
    base = {"batch_size": 256, "device": device, "seed": seed, **REFERENCE_EXECUTION}
    names = []
    for j in range(s["members"]):
        member_seed = seed * 1000 + j
        name = f"deep_ensemble_s{member_seed}"
        config = ImageTrainConfig(
            arch=s["arch"], method="deep_ensemble", epochs=s["epochs"],
            batch_size=s["batch_size"], input_size=s["input_size"], augment="crop",
            model_kwargs=dict(s["model_kwargs"]), seed=member_seed, device=device,
            tag=f"shift_{name}")
        ckpt = models / f"{name}.safetensors"
        trained = overwrite or not _done(ckpt, config)
        if trained:
            train_model(train, ckpt, config)
        spec = f"{s['arch']}={ckpt}"
        n = 0
        for folder in (val, test):
            n += len(predict_to_files(spec, folder, caches, PredictConfig(**base),
                                      overwrite=trained))
        for member, folder in iter_member_folders(corrupted, "imagenet-c"):
            if member.corruption in s["corruptions"] and member.severity in s["severities"]:
                n += len(predict_to_files(
                    spec, folder, caches,
                    PredictConfig(eval_set="imagenet-c", eval_member=member.name, **base),
                    overwrite=trained))
        names.append(name)
        log(f"  {name}: {'trained' if trained else 'reused'}, {n} caches")

    # the mCE baseline: the first member (its model name as the caches record it)
    baseline = min({i.model for i in index_caches([caches])})
    scores = score_shift(caches, ShiftConfig(calibration_size=s["calibration_size"],
                                             baseline=baseline, seed=seed))
    path = write_dataset(scores, out / "shift.nc", overwrite=True)
    log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return Path(path)


#: The driver of ``uqvision reproduce shift``.
REPRODUCTION = Reproduction("shift", DESCRIPTION, run, scales=("smoke",))
