"""``uqvision reproduce shift``: predictive uncertainty under dataset shift (Ovadia et al.
2019; docs/conventions.md#v-5).

A deep ensemble's members and one MC-dropout network are trained on the generated
``hierarchy`` stand-in (or a real image folder, ``--data ROOT --arch NAME``: ``ROOT/train``,
``ROOT/val``, ``ROOT/test``), its test split is corrupted as ImageNet-C is
(:func:`uqvision.data.corruptions.make_corrupted_folder`), and every network predicts the
clean validation and test folders and every corrupted member folder (eval set
``imagenet-c``; the MC-dropout network in ``mc_dropout`` mode, its passes in one cache). The
caches are scored by :func:`~.score.score_shift`: every network, the deep ensemble as one
predictor (``deep_ensemble[k]``), un-scaled and temperature-scaled on clean validation data,
with the first member (Ovadia's *vanilla* network) as the mCE baseline. The figures
(:func:`~.figures.draw_figures`) show the vanilla network, the MC-dropout network and the
ensemble; the findings (:func:`~.findings.shift_findings`) test the paper's claims on them.

Scales (:data:`SHIFT_SCALES`): ``smoke`` (tests, about 15 s) and ``cpu`` (the cpu hierarchy,
the 15 benchmark corruptions at severities 1-5, five members; about half an hour on 2 cores).

Steps, each skipped when its output is already complete (a rerun resumes): the stand-in, the
networks and their caches of :func:`~uqvision.protocols.base.corrupted_study`, then::

    OUT/shift.nc              uqvision.protocols.shift.score.score_shift
    OUT/figures/*.png         uqvision.protocols.shift.figures.draw_figures
    OUT/findings.md           uqvision.protocols.shift.findings.shift_findings

``--set`` options: ``calibration_size``, and those of a study under corruption: ``epochs``,
``members``, ``corruptions`` (comma-separated), ``severities`` (comma-separated),
``dropout_passes`` (0: no MC-dropout network), ``workers`` (corruption processes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from uqmetrics import write_dataset

from ...cache import index_caches
from ...data.corruptions import BENCHMARK_CORRUPTIONS
from ..base import CORRUPTED_SCALES, Reproduction, corrupted_study_driver, finish_reproduction
from . import DESCRIPTION
from .score import ShiftConfig, score_shift

__all__ = ["REPRODUCTION", "SHIFT_SCALES", "SMOKE", "run"]

#: Scales: name -> settings: the networks of :data:`~uqvision.protocols.base.CORRUPTED_SCALES`
#: and the corruptions. ``smoke``: three cheap corruptions at severities 1, 3, 5 (about 15 s on
#: 2 cores). ``cpu``: the cpu hierarchy (48 classes; 1,920 test images), the 15 benchmark
#: corruptions at every severity (144,000 corrupted images).
SHIFT_SCALES = {
    "smoke": {**CORRUPTED_SCALES["smoke"], "calibration_size": 0.5,
              "corruptions": ("gaussian_noise", "contrast", "pixelate"), "severities": (1, 3, 5)},
    "cpu": {**CORRUPTED_SCALES["cpu"], "calibration_size": 0.5,
            "corruptions": BENCHMARK_CORRUPTIONS},
}
#: The smoke scale (``SHIFT_SCALES["smoke"]``).
SMOKE = SHIFT_SCALES["smoke"]
_KEYS = ("epochs", "members", "corruptions", "severities", "calibration_size",
         "dropout_passes", "workers")


def _finish(out: Path, s: dict, caches: Path, *, seed: int, log: Callable[[str], None],
            t0: float) -> Path:
    """The scores, figures and findings of a run from its ``caches`` (``s``: its settings)."""
    # the mCE baseline: the first member, Ovadia's vanilla network (its name as caches record it)
    infos = index_caches([caches])
    vanilla = min(i.model for i in infos if i.model.endswith(f"deep_ensemble_s{seed * 1000}"))
    # the sets and the ensemble, named: val calibrates, test is scored, the members averaged
    members = sorted({i.model for i in infos if "deep_ensemble_s" in i.model})
    scores = score_shift(caches, ShiftConfig(
        calibration_size=s["calibration_size"], calibration="val", test="test",
        baseline=vanilla, seed=seed,
        ensembles={f"deep_ensemble[{len(members)}]": members} if len(members) > 1 else None))
    path = write_dataset(scores, out / "shift.nc", overwrite=True)
    # the figures and findings: vanilla, MC dropout and the ensemble (the other members are
    # in shift.nc)
    shown = [m for m in scores["model"].values.tolist()
             if m == vanilla or str(scores["kind"].sel(model=m).item()) == "ensemble"
             or "mc_dropout" in m]
    from .figures import draw_figures  # matplotlib: imported on use
    from .findings import format_findings, shift_findings

    figures = draw_figures(scores.sel(model=shown), out / "figures")
    return finish_reproduction(out, path, t0, figures,
                               format_findings(shift_findings(scores, vanilla=vanilla)), log)


#: ``run(out, *, scale="smoke", data=None, arch=None, seed=0, overwrite=False,
#: options=None, log=print, device="cpu") -> Path``: run the shift protocol at ``scale`` into
#: ``out`` (:func:`~uqvision.protocols.base.corrupted_study_driver`); returns ``out/shift.nc``.
run = corrupted_study_driver("shift", SHIFT_SCALES, _KEYS,
                             ("members", "dropout_passes", "workers"), _finish)
#: The driver of ``uqvision reproduce shift``.
REPRODUCTION = Reproduction("shift", DESCRIPTION, run, scales=tuple(SHIFT_SCALES))
