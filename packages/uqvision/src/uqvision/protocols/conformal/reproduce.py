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

Steps, each skipped when its output is already complete (a rerun resumes): the stand-in, the
networks and their caches of :func:`~uqvision.protocols.base.corrupted_study`, then::

    OUT/conformal.nc          uqvision.protocols.conformal.score.score_conformal
    OUT/figures/*.png         uqvision.protocols.conformal.figures.draw_figures
    OUT/findings.md           uqvision.protocols.conformal.findings.conformal_findings

``--set`` options: ``trials``, ``temperature_size``, and those of a study under corruption:
``epochs``, ``members``, ``corruptions`` (comma-separated), ``severities`` (comma-separated),
``dropout_passes`` (0: no MC-dropout network), ``workers`` (corruption processes).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

from uqmetrics import write_dataset

from ...cache import index_caches
from ..base import CORRUPTED_SCALES, Reproduction, corrupted_study_driver, finish_reproduction
from . import DESCRIPTION
from .score import ConformalConfig, ShortCalibrationWarning, score_conformal

__all__ = ["CONFORMAL_SCALES", "REPRODUCTION", "SMOKE", "run"]

#: Scales: name -> settings: the networks of :data:`~uqvision.protocols.base.CORRUPTED_SCALES`,
#: the corruptions and the trials. ``smoke``: two cheap corruptions at severities 1 and 5, 10
#: trials. ``cpu``: the cpu hierarchy (48 classes; 1,920 test images), five corruptions (noise,
#: blur, weather, digital) at every severity, 50 trials (scoring about 20 s per predictor on 2
#: cores; ``--set trials=100`` as the paper, twice that).
CONFORMAL_SCALES = {
    "smoke": {**CORRUPTED_SCALES["smoke"], "temperature_size": 0.2, "trials": 10,
              "corruptions": ("gaussian_noise", "contrast"), "severities": (1, 5)},
    "cpu": {**CORRUPTED_SCALES["cpu"], "temperature_size": 0.2, "trials": 50,
            "corruptions": ("gaussian_noise", "defocus_blur", "fog", "contrast",
                            "jpeg_compression")},
}
#: The smoke scale (``CONFORMAL_SCALES["smoke"]``).
SMOKE = CONFORMAL_SCALES["smoke"]
_KEYS = ("epochs", "members", "corruptions", "severities", "trials", "temperature_size",
         "dropout_passes", "workers")


def _finish(out: Path, s: dict, caches: Path, *, seed: int, log: Callable[[str], None],
            t0: float) -> Path:
    """The scores, figures and findings of a run from its ``caches`` (``s``: its settings)."""
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

    return finish_reproduction(out, path, t0, draw_figures(scores, out / "figures"),
                               format_findings(conformal_findings(scores), scores), log)


#: ``run(out, *, scale="smoke", data=None, arch=None, seed=0, overwrite=False,
#: options=None, log=print, device="cpu") -> Path``: run the conformal protocol at ``scale`` into
#: ``out`` (:func:`~uqvision.protocols.base.corrupted_study_driver`); returns ``out/conformal.nc``.
run = corrupted_study_driver("conformal", CONFORMAL_SCALES, _KEYS,
                             ("members", "dropout_passes", "workers", "trials"), _finish)
#: The driver of ``uqvision reproduce conformal``.
REPRODUCTION = Reproduction("conformal", DESCRIPTION, run, scales=tuple(CONFORMAL_SCALES))
