"""The figures and ``uqvision plot`` after the smoke-scale audit: a figure without data is not
drawn (and said), the ensembles figure's series are all distinguishable, the plot options are
the protocols' names (their score names kept as aliases), and the refusals name the option
(``--out``), the tool that wrote a file (a uqreg study) and a few of many foreign files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics import write_dataset
from uqmetrics.runs.testing.filesystems import full_filesystems

from uqvision.cli import build_parser, main
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.ood.figures import draw_figures, plot_ood_bars
from uqvision.protocols.pitfalls.plots import plot_ensembles

MODELS, DETS, SETS = ["a", "b"], ["msp", "energy"], ["f1", "f2"]


def _ood_far_only() -> xr.Dataset:
    """An ood result of far-OOD sets only (as the stand-in's): every near_* is NaN."""
    rng = np.random.default_rng(0)
    auroc = 0.6 + 0.3 * rng.random((2, 2, 2))
    nan = np.full((2, 2), np.nan)
    far = auroc.mean(-1)
    return xr.Dataset(
        {"auroc": (("model", "detector", "ood_set"), auroc),
         "near_auroc": (("model", "detector"), nan), "far_auroc": (("model", "detector"), far),
         "near_fpr_at_95_tpr": (("model", "detector"), nan),
         "far_fpr_at_95_tpr": (("model", "detector"), 1 - far),
         "forward_passes": ("model", [1, 1])},
        coords={"model": MODELS, "detector": DETS, "ood_set": SETS,
                "ood_split": ("ood_set", ["far", "far"])},
        attrs={"protocol": "ood"})


def test_a_split_without_sets_has_no_figure_and_no_legend_entry(tmp_path):
    from uqvision.plots import skipped_figures

    said: list[str] = []
    with skipped_figures(said.append):
        paths = draw_figures(_ood_far_only(), tmp_path / "fig")
    names = sorted(p.name for p in paths)
    assert names == ["ood_bars.png", "ood_cost_far.png", "ood_heatmap.png"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == names
    assert said == ["ood_cost_near.png: not drawn (no near-OOD set scored)"]
    fig = plot_ood_bars(_ood_far_only())
    for ax in fig.axes:  # the legend names the far sets only; no bar of the near split
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["far-OOD"]
        assert not [p for p in ax.patches if ":near:" in str(p.get_gid())]


def test_plot_says_the_figure_it_skips_in_one_line(tmp_path, capsys):
    scores = write_dataset(_ood_far_only(), tmp_path / "ood.nc")
    assert main(["plot", "--ood", str(scores), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ood_cost_near.png: not drawn (no near-OOD set scored)" in out
    assert not (tmp_path / "fig" / "ood_cost_near.png").exists()


def _ensembles(methods: list[str]) -> xr.Dataset:
    rng = np.random.default_rng(1)
    shape = (len(methods), 4, 3)
    return xr.Dataset(
        {"cll": (("method", "size", "order"), rng.normal(size=shape)),
         "dee": (("method", "size", "order"), rng.random(shape) * 4)},
        coords={"method": methods, "size": [1, 2, 3, 4]}, attrs={"reference": "deep_ensemble"})


BASES = ["deep_ensemble", "mc_dropout", "fge", "sse", "swag", "csgld", "vi", "kfac_laplace",
         "dropconnect"]
#: 17 series, as ``uqvision plot --ensembles`` of the audit: deep_ensemble and csgld (the 1st
#: and 11th of matplotlib's 10 colours) and their _tta pairs looked the same.
SERIES = [s for b in BASES for s in (b, f"{b}_tta")][:16] + ["single_tta"]


@pytest.mark.parametrize("n", [len(SERIES), 2 * 23])
def test_every_series_of_the_ensembles_figure_is_distinguishable(tmp_path, n):
    from uqvision.protocols.pitfalls.plots import ensemble_figure

    methods = SERIES if n == len(SERIES) else [f"m{i}{t}" for i in range(23)
                                                for t in ("", "_tta")]
    ds = _ensembles(methods)
    for var in ("cll", "dee"):
        fig = ensemble_figure(ds, var)
        ax = fig.axes[0]
        styles = [(line.get_color(), line.get_linestyle(), line.get_marker())
                  for line in ax.lines]
        assert len(styles) == len(methods) and len(set(styles)) == len(methods), styles
        by_name = dict(zip(methods, styles, strict=True))
        if "csgld" in methods:  # the pair the audit saw as one
            assert by_name["deep_ensemble"] != by_name["csgld"]
            assert by_name["deep_ensemble_tta"] != by_name["csgld_tta"]
            # a method and its TTA variant: one colour, another line style
            assert by_name["csgld"][0] == by_name["csgld_tta"][0]
            assert by_name["csgld"][1] != by_name["csgld_tta"][1]
        legend = [(h.get_color(), h.get_linestyle(), h.get_marker())
                  for h in ax.get_legend().legend_handles]
        assert legend == styles  # the legend shows the same styles
    assert sorted(p.name for p in plot_ensembles(ds, tmp_path)) == ["ensemble_cll.png",
                                                                    "ensemble_dee.png"]


def _plot_options() -> dict[str, list[str]]:
    ap = build_parser()
    plot = next(a for a in ap._actions if a.dest == "command").choices["plot"]
    return {a.dest: a for a in plot._actions}


def test_plot_takes_every_protocols_name_and_keeps_the_score_names():
    actions = _plot_options()
    for proto in VISION_PROTOCOLS.values():
        if proto.plots is None:
            continue
        flags = actions[proto.name].option_strings
        assert flags[0] == f"--{proto.name}"
        assert f"--{proto.score_name}" in flags
    assert set(actions["pitfalls"].option_strings) == {"--pitfalls", "--ensembles"}
    assert set(actions["url"].option_strings) == {"--url", "--transfer"}
    for dest in ("caches", "dataset", "out"):
        assert actions[dest].help, dest


def _uqreg_study(path: Path) -> Path:
    """A result file as ``uqreg study`` writes it: no protocol attr, its run recorded."""
    ds = xr.Dataset({"coverage": ("method", [0.9, 0.8])}, coords={"method": ["blr", "ens"]},
                    attrs={"title": "uqreg coverage study: sinusoid", "uqreg_version": "0.1.0",
                           "run_config": json.dumps({"command": "uqreg study",
                                                     "options": {"out": str(path.parent)}})})
    return write_dataset(ds, path)


@pytest.mark.parametrize("flag", ["--pitfalls", "--ensembles", "--url", "--transfer"])
def test_plot_of_a_uqreg_study_says_to_use_uqreg_plot(tmp_path, refused, flag):
    study = _uqreg_study(tmp_path / "study.nc")
    line = refused(["plot", flag, study, "--out", tmp_path / "fig"])
    assert line == (f"uqvision plot: error: {flag} {str(study)!r} is a result of uqreg (its "
                    "attrs say so), not a uqvision score file: draw it with uqreg plot")
    assert not (tmp_path / "fig").exists()


def test_plot_of_a_study_without_its_run_recorded_reads_its_title(tmp_path, refused):
    ds = xr.Dataset({"coverage": ("method", [0.9])}, coords={"method": ["blr"]},
                    attrs={"title": "uqreg coverage study: sinusoid", "uqreg_version": "0.1.0"})
    study = write_dataset(ds, tmp_path / "study.nc")
    assert refused(["plot", "--pitfalls", study, "--out", tmp_path / "fig"]).endswith(
        "draw it with uqreg plot")


def test_plot_caches_of_many_foreign_files_names_three_and_a_count(tmp_path, refused):
    folder = tmp_path / "foreign"
    folder.mkdir()
    for i in range(7):
        _uqreg_study(folder / f"s{i}.nc")
    line = refused(["plot", "--caches", folder, "--out", tmp_path / "fig"])
    assert "among its 7 .nc files: 7 not a complete uqvision prediction cache: " in line
    assert all(f"s{i}.nc" in line for i in range(3)) and line.endswith(" and 4 more")
    assert not any(f"s{i}.nc" in line for i in range(3, 7))


def test_plot_out_that_cannot_be_written_names_the_option(tmp_path, refused):
    """A figure that cannot be saved (here: a real file system with no space left) is an error
    naming ``--out``; it named the figure's path alone."""
    scores = write_dataset(_ood_far_only(), tmp_path / "ood.nc")
    with full_filesystems(tmp_path) as make:
        out = make(0) / "figures"
        line = refused(["plot", "--ood", scores, "--out", str(out)])
    assert line.startswith(f"uqvision plot: error: --out {str(out)!r}"), line
