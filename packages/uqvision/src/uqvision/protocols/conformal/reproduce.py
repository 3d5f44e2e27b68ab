"""``uqvision reproduce conformal``: conformal prediction sets (Angelopoulos et al. 2021;
docs/conventions.md#v-7).

A deep ensemble's members and one MC-dropout network are trained on the generated
``hierarchy`` stand-in (or a real image folder, ``--data ROOT --arch NAME``: ``ROOT/train``,
``ROOT/val``, ``ROOT/test``), its test split is corrupted as ImageNet-C is
(:func:`uqvision.data.corruptions.make_corrupted_folder`), and every network predicts the
clean validation and test folders and every corrupted member folder (eval set
``imagenet-c``). The caches are scored by :func:`~.score.score_conformal`: Naive, THR, APS,
RAPS and Mondrian APS sets of every network and of the deep ensemble (``deep_ensemble[k]``)
at alpha 0.1 and 0.05, over random splits of the clean test images (the temperature fitted
on part of the validation images), and the coverage left on every corrupted member. Then the
figures (:func:`~.figures.draw_figures`) and the findings
(:func:`~.findings.conformal_findings`).

Scales (:data:`CONFORMAL_SCALES`): ``smoke`` (tests, about 20 s) and ``cpu`` (the cpu
hierarchy, 5 corruptions at severities 1-5, five members; about 10 minutes on 2 cores).

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy (not with --data)
    OUT/data-c/<c>/<s>/       make_corrupted_folder of the test split
    OUT/models/<run>.*        uqvision.training.loop.train_model
    OUT/caches/*.nc           uqvision.predict: val, test and every corrupted member
    OUT/conformal.nc          uqvision.protocols.conformal.score.score_conformal
    OUT/figures/*.png         uqvision.protocols.conformal.figures.draw_figures
    OUT/findings.md           uqvision.protocols.conformal.findings.conformal_findings

``--set`` options: ``epochs``, ``members``, ``corruptions`` (comma-separated),
``severities`` (comma-separated), ``trials``, ``temperature_size``, ``dropout_passes`` (0: no
MC-dropout network), ``workers`` (corruption processes).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

from uqmetrics import write_dataset

from ...cache import index_caches
from ..base import Reproduction, corrupted_study, corrupted_study_settings
from . import DESCRIPTION
from .score import ConformalConfig, ShortCalibrationWarning, score_conformal

__all__ = ["CONFORMAL_SCALES", "REPRODUCTION", "SMOKE", "run"]

_BASE = {"arch": "test_resnet", "input_size": 32, "temperature_size": 0.2, "dropout_p": 0.3,
         "workers": 1}
#: Scales: name -> settings. ``smoke``: the hierarchy smoke set, a half-width timm test_resnet,
#: two members and an MC-dropout network of three epochs, two cheap corruptions at severities
#: 1 and 5, 10 trials. ``cpu``: the cpu hierarchy (48 classes; 1,920 test images), the
#: full-width test_resnet, five members and an MC-dropout network of 15 epochs, five
#: corruptions (noise, blur, weather, digital) at every severity, 50 trials (scoring about
#: 20 s per predictor on 2 cores; ``--set trials=100`` as the paper, twice that).
CONFORMAL_SCALES = {
    "smoke": {**_BASE, "hierarchy": "smoke", "epochs": 3.0, "members": 2, "batch_size": 32,
              "model_kwargs": {"channels": [16, 24, 24, 48]},
              "corruptions": ("gaussian_noise", "contrast"), "severities": (1, 5),
              "dropout_passes": 3, "trials": 10},
    "cpu": {**_BASE, "hierarchy": "cpu", "epochs": 15.0, "members": 5, "batch_size": 128,
            "model_kwargs": {},
            "corruptions": ("gaussian_noise", "defocus_blur", "fog", "contrast",
                            "jpeg_compression"),
            "severities": (1, 2, 3, 4, 5), "dropout_passes": 10, "workers": 2, "trials": 50},
}
#: The smoke scale (``CONFORMAL_SCALES["smoke"]``).
SMOKE = CONFORMAL_SCALES["smoke"]
_KEYS = ("epochs", "members", "corruptions", "severities", "trials", "temperature_size",
         "dropout_passes", "workers")


def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
        seed: int = 0, overwrite: bool = False, options: dict | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """Run the conformal protocol at ``scale`` into ``out``; returns ``out/conformal.nc``."""
    t0 = time.perf_counter()
    s = corrupted_study_settings("conformal", CONFORMAL_SCALES, _KEYS, ("members", "dropout_passes", "workers", "trials"), scale=scale,
                                 arch=arch, data=data, options=dict(options or {}))
    out = Path(out)
    caches = corrupted_study(out, s, tag="conformal", data=data, seed=seed, scale=scale,
                             overwrite=overwrite, log=log, device=device)

    t1 = time.perf_counter()
    with warnings.catch_warnings():  # logged below, from the result's notes
        warnings.simplefilter("ignore", ShortCalibrationWarning)
        # the sets and the ensemble, named: val calibrates, test is the pool
        members = sorted({i.model for i in index_caches([caches])
                          if "deep_ensemble_s" in i.model})
        scores = score_conformal(caches, ConformalConfig(
            trials=s["trials"], temperature_size=s["temperature_size"], seed=seed,
            calibration="val", test="test",
            ensembles={f"deep_ensemble[{len(members)}]": members} if len(members) > 1
            else None))
    if scores.attrs.get("notes"):
        log(f"note: {scores.attrs['notes']}")
    path = write_dataset(scores, out / "conformal.nc", overwrite=True)
    log(f"scored: {path} ({time.perf_counter() - t1:.0f} s)")
    from .figures import draw_figures  # matplotlib: imported on use
    from .findings import conformal_findings, format_findings

    figures = draw_figures(scores, out / "figures")
    (out / "findings.md").write_text(format_findings(conformal_findings(scores), scores),
                                     encoding="utf-8")
    log(f"figures: {out / 'figures'} ({len(figures)} files); findings: {out / 'findings.md'}")
    log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return Path(path)


#: The driver of ``uqvision reproduce conformal``.
REPRODUCTION = Reproduction("conformal", DESCRIPTION, run, scales=tuple(CONFORMAL_SCALES))
