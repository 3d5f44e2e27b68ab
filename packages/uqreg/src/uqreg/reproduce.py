"""Reproduce the paper's Figures 1–7 (``uqreg reproduce``).

Runs the three experiments as resumable sweeps (E.1 sinusoid, E.2 Styblinski–Tang, E.3 2-D
polynomial) at a chosen scale and draws the figures from the combined study files:

===========  ===========================================================================
figure       content
===========  ===========================================================================
fig1         E.1, f_main = 1: prediction ± 1.96·std of BLR, BD, VD, EnsBS
fig2         E.1, f_main = 5 (or the largest run): the same
fig3         E.1: deviation, uncertainty, coverage vs f_main at x = −2.38, 1.2, −5.11
fig4         E.2, d = 2: prediction bands along the diagonal
fig5         E.2, d = 4 (or the largest run): the same
fig6         E.2: deviation, uncertainty, coverage vs d at λ = 0.5996, 0.074
fig7         E.3: log10 deviation, log10 uncertainty, coverage maps of BLR, BD, EnsBS
===========  ===========================================================================

Scales: ``paper`` uses the presets ``paper-e1/e2/e3`` (120 members, 200 MC passes, 50/50/30
repetitions, f_main 1–10, d 1–4); ``cpu`` is what two CPU cores finish in about an hour.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import uqmetrics
from uqmetrics.plotting import save_figure

from .engine import TrainConfig
from .plots import plot_bands, plot_coverage_map, plot_probes
from .presets import PRESETS
from .study import StudyConfig
from .sweep import run_study_sweep

BAND_METHODS = ("blr", "bd", "vd", "ens_bs")
MAP_METHODS = ("blr", "bd", "ens_bs")

_CPU_TRAIN = TrainConfig(members=20, mc_samples=100)
_CPU_TRAIN_SMALL = TrainConfig(members=8, mc_samples=100)

SCALES: dict[str, dict[str, StudyConfig]] = {
    "paper": {"e1": PRESETS["paper-e1"], "e2": PRESETS["paper-e2"], "e3": PRESETS["paper-e3"]},
    "cpu": {
        "e1": StudyConfig(task="sinusoid", complexities=(1, 2, 3, 4, 5), repetitions=10, train=_CPU_TRAIN),
        "e2": StudyConfig(task="styblinski_tang", complexities=(1, 2), repetitions=6, train=_CPU_TRAIN_SMALL),
        "e3": StudyConfig(task="polynomial", complexities=(2,), repetitions=6, train=_CPU_TRAIN_SMALL),
    },
    "smoke": {  # seconds: for tests of this module
        "e1": StudyConfig(task="sinusoid", complexities=(1, 2), methods=BAND_METHODS, repetitions=2,
                          train=TrainConfig(members=3, epochs=5, mc_samples=5)),
        "e2": StudyConfig(task="styblinski_tang", complexities=(1, 2), methods=BAND_METHODS, repetitions=2,
                          train=TrainConfig(members=3, epochs=5, mc_samples=5)),
        "e3": StudyConfig(task="polynomial", complexities=(2,), methods=MAP_METHODS, repetitions=2,
                          train=TrainConfig(members=3, epochs=5, mc_samples=5)),
    },
}


def _nearest(values, target):
    values = [int(v) for v in values]
    return target if target in values else max(values)


def draw_figures(e1, e2, e3, out_dir) -> list[Path]:
    """Figures 1–7 from the three study datasets (any may be None: its figures are skipped)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {}
    if e1 is not None:
        m = [x for x in BAND_METHODS if x in e1.method.values]
        for fig, target in (("fig1", 1), ("fig2", 5)):  # the largest level run stands in for 5
            c = _nearest(e1.complexity.values, target)
            figs[f"{fig}_e1_bands_fmain{c}"] = plot_bands(e1, c, methods=m)
        figs["fig3_e1_vs_fmain"] = plot_probes(e1)
    if e2 is not None:
        m = [x for x in BAND_METHODS if x in e2.method.values]
        for fig, target in (("fig4", 2), ("fig5", 4)):  # the largest dimension run stands in for 4
            d = _nearest(e2.complexity.values, target)
            if fig == "fig5" and d == _nearest(e2.complexity.values, 2):
                continue  # nothing beyond Figure 4 was run
            figs[f"{fig}_e2_bands_d{d}"] = plot_bands(e2, d, methods=m)
        figs["fig6_e2_vs_d"] = plot_probes(e2)
    if e3 is not None:
        figs["fig7_e3_coverage_map"] = plot_coverage_map(e3, methods=[x for x in MAP_METHODS if x in e3.method.values])
    paths = []
    for name, fig in figs.items():
        paths.append(save_figure(fig, out / f"{name}.png"))
        plt.close(fig)
    return paths


def coverage_table(ds, *, points: dict | None = None) -> str:
    """A markdown table of coverage per method (rows) and complexity (columns): in/out region
    averages and, when given, named probe points ``{label: point index}``."""
    cname = ds.attrs.get("complexity_name", "complexity")
    head = "| method | " + " | ".join(f"{cname}={c}" for c in ds.complexity.values) + " |"
    lines = [head, "|" + "---|" * (len(ds.complexity) + 1)]
    for m in ds.method.values:
        cells = []
        for c in ds.complexity.values:
            sel = {"method": m, "complexity": c}
            parts = [f"{float(ds.region_coverage.sel({**sel, 'region': r})):.2f}" for r in ("in", "out")]
            if points:
                parts += [f"{float(ds.coverage.sel({**sel, 'point': p})):.2f}" for p in points.values()]
            cells.append(" / ".join(parts))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reproduce(out_dir, *, scale: str = "cpu", experiments=("e1", "e2", "e3"), device: str = "cpu",
              scheduler: str | None = None, n_workers: int = 2, chunk_repetitions: int = 5,
              progress: bool = True) -> list[Path]:
    """Run (or resume) the sweeps of ``experiments`` at ``scale`` and draw Figures 1–7.

    Each experiment's combined study is written to ``out_dir/<exp>/study.nc``; an existing
    combined file is reused as it is.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {sorted(SCALES)}, got {scale!r}")
    unknown = set(experiments) - {"e1", "e2", "e3"}
    if unknown:
        raise ValueError(f"experiments must be among e1, e2, e3, got {sorted(unknown)}")
    out = Path(out_dir)
    results = {}
    for exp in ("e1", "e2", "e3"):
        if exp not in experiments:
            results[exp] = None
            continue
        target = out / exp / "study.nc"
        if target.exists():
            results[exp] = uqmetrics.read_dataset(target)
            continue
        cfg = SCALES[scale][exp]
        cfg = replace(cfg, train=replace(cfg.train, device=device))
        ds, report = run_study_sweep(cfg, out / exp, chunk_repetitions=chunk_repetitions, scheduler=scheduler,
                                     n_workers=n_workers, progress=progress)
        if ds is None:
            raise RuntimeError(f"{exp}: cells failed: {report.failed}; rerun to retry them")
        ds.attrs["reproduce_scale"] = scale
        uqmetrics.write_dataset(ds, target)
        results[exp] = ds
    return draw_figures(results["e1"], results["e2"], results["e3"], out / "figures")
