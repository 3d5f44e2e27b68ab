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

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy (not with --data)
    OUT/data-c/<c>/<s>/       make_corrupted_folder of the test split
    OUT/models/<run>.*        uqvision.training.loop.train_model
    OUT/caches/*.nc           uqvision.predict: val, test and every corrupted member
    OUT/shift.nc              uqvision.protocols.shift.score.score_shift
    OUT/figures/*.png         uqvision.protocols.shift.figures.draw_figures
    OUT/findings.md           uqvision.protocols.shift.findings.shift_findings

``--set`` options: ``epochs``, ``members``, ``corruptions`` (comma-separated),
``severities`` (comma-separated), ``calibration_size``, ``dropout_passes`` (0: no MC-dropout
network), ``workers`` (corruption processes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from uqmetrics import write_dataset

from ...cache import index_caches
from ...data.corruptions import BENCHMARK_CORRUPTIONS
from ..base import Reproduction, corrupted_study, corrupted_study_settings
from . import DESCRIPTION
from .score import ShiftConfig, score_shift

__all__ = ["REPRODUCTION", "SHIFT_SCALES", "SMOKE", "run"]

_BASE = {"arch": "test_resnet", "input_size": 32, "calibration_size": 0.5, "dropout_p": 0.3,
         "workers": 1}
#: Scales: name -> settings. ``smoke``: the hierarchy smoke set, a half-width timm test_resnet,
#: two members and an MC-dropout network of three epochs, three cheap corruptions at severities
#: 1, 3, 5 (about 15 s on 2 cores). ``cpu``: the cpu hierarchy (48 classes; 1,920 test
#: images), the full-width test_resnet, five members and an MC-dropout network of 15 epochs,
#: the 15 benchmark corruptions at every severity (144,000 corrupted images).
SHIFT_SCALES = {
    "smoke": {**_BASE, "hierarchy": "smoke", "epochs": 3.0, "members": 2, "batch_size": 32,
              "model_kwargs": {"channels": [16, 24, 24, 48]},
              "corruptions": ("gaussian_noise", "contrast", "pixelate"), "severities": (1, 3, 5),
              "dropout_passes": 3},
    "cpu": {**_BASE, "hierarchy": "cpu", "epochs": 15.0, "members": 5, "batch_size": 128,
            "model_kwargs": {}, "corruptions": BENCHMARK_CORRUPTIONS,
            "severities": (1, 2, 3, 4, 5), "dropout_passes": 10, "workers": 2},
}
#: The smoke scale (``SHIFT_SCALES["smoke"]``).
SMOKE = SHIFT_SCALES["smoke"]
_KEYS = ("epochs", "members", "corruptions", "severities", "calibration_size",
         "dropout_passes", "workers")


def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
        seed: int = 0, overwrite: bool = False, options: dict | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """Run the shift protocol at ``scale`` into ``out``; returns ``out/shift.nc``."""
    t0 = time.perf_counter()
    s = corrupted_study_settings("shift", SHIFT_SCALES, _KEYS, ("members", "dropout_passes", "workers"), scale=scale,
                                 arch=arch, data=data, options=dict(options or {}))
    out = Path(out)
    caches = corrupted_study(out, s, tag="shift", data=data, seed=seed, scale=scale,
                             overwrite=overwrite, log=log, device=device)

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
    findings = shift_findings(scores, vanilla=vanilla)
    (out / "findings.md").write_text(format_findings(findings), encoding="utf-8")
    log(f"figures: {out / 'figures'} ({len(figures)} files); findings: {out / 'findings.md'}")
    log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return Path(path)


#: The driver of ``uqvision reproduce shift``.
REPRODUCTION = Reproduction("shift", DESCRIPTION, run, scales=tuple(SHIFT_SCALES))
