"""Every figure uqreg draws is legible: drawn from small result files of every kind
(:data:`uqreg.plots.RESULT_KINDS`, through :func:`uqreg.plots.plot_result`, and the recipe
comparison of ``uqreg reproduce``), with their methods as run and tiled to a dozen, no legend
runs over a title, a label, another legend or another panel, no title or label over another,
nothing past the figure's edge (:func:`uqmetrics.report.plotting.overlapping_text`), and no two
entries of a legend look alike (:func:`~uqmetrics.report.plotting.alike_legend_entries`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import xarray as xr
from uqmetrics.report.plotting import alike_legend_entries, overlapping_text

from uqreg import plots
from uqreg.engine import TrainConfig
from uqreg.study import StudyConfig, run_study

#: Methods of a result: one (the last; its narrowest figures), as run, and tiled to as many as a
#: sweep of every method gives.
SCALES = {"one": 1, "few": None, "many": 12}
TINY = TrainConfig(members=2, epochs=2, mc_samples=3)


def _tile(ds: xr.Dataset, n: int | None) -> xr.Dataset:
    """``ds`` with its methods followed by copies named ``<method>_variant<i>`` up to ``n``
    methods (None: as it is; 1: its last method alone)."""
    methods = [str(m) for m in ds.method.values]
    if n == 1:  # a disentanglement study's exact oracle stays: it is drawn beside every method
        return ds.isel(method=[i for i, m in enumerate(methods)
                               if i == len(methods) - 1 or m == ds.attrs.get("oracle")])
    if n is None or n <= len(methods):
        return ds
    copies = [ds.isel(method=[i % len(methods)]).assign_coords(
        method=[f"{methods[i % len(methods)]}_variant{i}"]) for i in range(n - len(methods))]
    return xr.concat([ds, *copies], dim="method", data_vars="minimal", coords="minimal",
                     compat="override", join="override")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, xr.Dataset]:
    return small_results(tmp_path_factory.mktemp("disentangle"))


def small_results(folder: Path) -> dict[str, xr.Dataset]:
    """A small result of every kind: 1-D (two recipes) and 2-D studies, a real-data study, a
    disentanglement study (run in ``folder``) and a reference."""
    from uqreg.disentangle import SCALES as DISENTANGLE_SCALES
    from uqreg.disentangle import run_task
    from uqreg.real import REAL_TRAIN, RealConfig, run_real
    from uqreg.reference import reference_dataset

    study = StudyConfig(task="sinusoid", complexities=(1, 2), methods=("blr", "ens"), repetitions=2,
                        recipes=("paper", "none"), train=TINY)
    scale = replace(DISENTANGLE_SCALES.lookup("smoke"), name="tiny", tasks={"sinusoid_het": (1, 2)},
                    methods=("ens+mv",), repetitions=2)
    run_task(scale, "sinusoid_het", folder, progress=False)
    return {
        "study": run_study(study, progress=False),
        "study_2d": run_study(replace(study, task="polynomial", complexities=(2,), recipes=("paper",)),
                              progress=False),
        "real": run_real(RealConfig(n_splits=2, methods=("blr", "ens"),
                                    train=replace(REAL_TRAIN, members=2, epochs=2, mc_samples=3)),
                         progress=False),
        "disentangle": xr.open_dataset(folder / "study.nc").load(),
        "reference": reference_dataset("sinusoid_het", 1, repetitions=2),
    }


def _problems(fig) -> list:
    return overlapping_text(fig) + alike_legend_entries(fig)


def drawn_problems(ds: xr.Dataset, monkeypatch, out: Path) -> dict[str, list]:
    """File name -> the problems of each figure :func:`uqreg.plots.plot_result` saves of
    ``ds`` (``save_figure`` recorded, the figures still written into ``out``)."""
    found: dict[str, list] = {}
    save = plots.save_figure

    def record(fig, path, **kwargs):
        found[Path(path).name] = _problems(fig)
        return save(fig, path, **kwargs)

    monkeypatch.setattr(plots, "save_figure", record)
    plots.plot_result(ds, out)
    return found


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("kind", ["study", "study_2d", "real", "disentangle", "reference"])
def test_every_figure_of_every_result_kind_is_legible(results, kind, scale, monkeypatch, tmp_path):
    ds = results[kind] if kind == "reference" else _tile(results[kind], SCALES[scale])
    if kind == "study" and scale == "many":  # one recipe: the other's figures are alike
        ds = ds.isel(recipe=[0])
    found = drawn_problems(ds, monkeypatch, tmp_path)
    assert found, f"no figure of {kind}"
    assert {f: o for f, o in found.items() if o} == {}


@pytest.mark.parametrize("scale", SCALES)
def test_the_recipe_comparison_is_legible(results, scale):
    fig = plots.plot_recipes(_tile(results["study"], SCALES[scale]))
    try:
        assert _problems(fig) == []
    finally:
        plt.close(fig)


@pytest.mark.parametrize("scores", [("coverage",), ("coverage", "mace")])
def test_the_scores_of_a_narrow_real_data_figure_are_legible(results, scores):
    """The figure of one or two scores is narrow: its legend, top right, ran over the suptitle,
    which ran past the figure's edge."""
    fig = plots.plot_real_scores(results["real"], scores=scores)
    try:
        assert _problems(fig) == []
    finally:
        plt.close(fig)
