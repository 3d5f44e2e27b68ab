"""The shift protocol's figures (uqvision.protocols.shift.figures): the numbers drawn are read
back from the artists (their gids) and compared with the result Dataset's; missing members are
left out, never drawn as 0; optional variables may be absent; ``uqvision plot --shift``."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from uqmetrics import InputError, write_dataset

from uqvision.cache import cache_dataset, cache_key
from uqvision.cli import main
from uqvision.protocols.shift.figures import (
    BOX_METRICS,
    draw_figures,
    plot_shift_acc_vs_ece,
    plot_shift_boxes,
    plot_shift_heatmap,
)
from uqvision.protocols.shift.score import SHIFT_METRICS, score_shift

MODELS = ["vanilla", "deep_ensemble"]
CORRUPTIONS = ["fog", "noise", "pixelate", "contrast"]
SEVERITIES = [1, 2, 3, 4, 5]
CALIBRATIONS = ["none", "temperature"]
FILES = ["shift_boxes.png", "shift_heatmap.png", "shift_acc_vs_ece.png"]
#: The (model, corruption, severity) left missing (NaN) in every metric.
MISSING = ("vanilla", "noise", 3)


def _result(seed: int = 0, *, optional: bool = True, natural: bool = False) -> xr.Dataset:
    """A shift result by hand: random metrics in (0.05, 0.95) with one missing member; with
    ``optional`` the clean metrics, temperatures and corruption errors; with ``natural`` the
    natural shift sets' ``set_<metric>``."""
    rng = np.random.default_rng(seed)
    shape = (len(MODELS), len(CORRUPTIONS), len(SEVERITIES), len(CALIBRATIONS))
    data = {}
    for m in SHIFT_METRICS:
        values = rng.uniform(0.05, 0.95, shape)
        values[MODELS.index(MISSING[0]), CORRUPTIONS.index(MISSING[1]),
               SEVERITIES.index(MISSING[2])] = np.nan
        data[m] = (("model", "corruption", "severity", "calibration"), values)
        if optional:
            data[f"clean_{m}"] = (("model", "calibration"),
                                  rng.uniform(0.05, 0.95, (len(MODELS), len(CALIBRATIONS))))
        if natural:
            data[f"set_{m}"] = (("model", "shift_set", "calibration"),
                                rng.uniform(0.05, 0.95, (len(MODELS), 2, len(CALIBRATIONS))))
    coords = {"model": MODELS, "corruption": CORRUPTIONS, "severity": SEVERITIES,
              "calibration": CALIBRATIONS}
    if optional:
        data["temperature"] = ("model", [1.3, 0.9])
        data["mean_corruption_error"] = ("model", [1.0, 0.8])
        data["relative_mean_corruption_error"] = ("model", [1.0, 0.7])
    if natural:
        coords["shift_set"] = ["imagenet-v2", "imagenet-r"]
    return xr.Dataset(data, coords=coords)


def _artists(fig, prefix: str) -> dict[str, object]:
    """gid -> artist of every artist of ``fig`` whose gid starts with ``prefix``."""
    found = {a.get_gid(): a for a in fig.findobj(lambda a: str(a.get_gid()).startswith(prefix))}
    assert found, f"no artist with gid {prefix}*"
    return found


def test_draw_figures_writes_nonempty_pngs(tmp_path):
    paths = draw_figures(_result(natural=True), tmp_path / "fig")
    assert [p.name for p in paths] == FILES
    for p in paths:
        assert p.parent == tmp_path / "fig"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


@pytest.mark.parametrize("calibration", CALIBRATIONS)
def test_box_medians_and_quartiles_are_over_corruptions_per_severity(calibration):
    ds = _result()
    fig = plot_shift_boxes(ds)
    medians = _artists(fig, "median:")
    boxes = _artists(fig, "box:")
    for metric in ("accuracy", "ece", "brier"):
        for model in MODELS:
            for s in SEVERITIES:
                values = ds[metric].sel(model=model, severity=s, calibration=calibration).values
                values = values[np.isfinite(values)]  # the missing member is left out
                key = f"{metric}:{calibration}:{model}:{s}"
                median = medians[f"median:{key}"].get_ydata()
                np.testing.assert_allclose(median, np.median(values), rtol=1e-12)
                box_y = boxes[f"box:{key}"].get_path().vertices[:, 1]
                np.testing.assert_allclose([box_y.min(), box_y.max()],
                                           np.percentile(values, [25, 75]), rtol=1e-12)
            clean = float(ds[f"clean_{metric}"].sel(model=model, calibration=calibration))
            np.testing.assert_allclose(
                medians[f"median:{metric}:{calibration}:{model}:clean"].get_ydata(), clean)


def test_boxes_sit_in_their_severity_group_side_by_side():
    fig = plot_shift_boxes(_result(), metrics=("ece",))
    medians = _artists(fig, "median:ece:")
    groups = ["clean"] + [str(s) for s in SEVERITIES]
    series = [(m, c) for m in MODELS for c in CALIBRATIONS]
    for g, group in enumerate(groups):
        centres = [np.mean(medians[f"median:ece:{c}:{m}:{group}"].get_xdata())
                   for m, c in series]
        assert np.all(np.diff(centres) > 0)  # in series order
        assert g - 0.5 < min(centres) and max(centres) < g + 0.5  # within the group
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == groups


def test_a_missing_member_is_left_out_of_its_box_not_drawn_as_zero():
    ds = _result()
    model, _, severity = MISSING
    ds["accuracy"].loc[{"model": model, "corruption": "fog", "severity": severity}] = 0.9
    ds["accuracy"].loc[{"model": model, "corruption": "pixelate", "severity": severity}] = 0.8
    ds["accuracy"].loc[{"model": model, "corruption": "contrast", "severity": severity}] = 0.1
    fig = plot_shift_boxes(ds, metrics=("accuracy",), calibrations=("none",))
    median = _artists(fig, f"median:accuracy:none:{model}:{severity}")
    # over (0.9, 0.8, 0.1): 0.8; with the NaN drawn as 0 it would be 0.45
    np.testing.assert_allclose(next(iter(median.values())).get_ydata(), 0.8)
    # a severity missing for every corruption draws no box at all
    ds["accuracy"].loc[{"model": model, "severity": 5}] = np.nan
    fig = plot_shift_boxes(ds, metrics=("accuracy",), calibrations=("none",))
    assert f"median:accuracy:none:{model}:5" not in _artists(fig, "median:")
    assert f"median:accuracy:none:{model}:4" in _artists(fig, "median:")


def test_heatmap_cells_equal_the_result_and_nan_cells_are_blank():
    ds = _result()
    fig = plot_shift_heatmap(ds)
    images = _artists(fig, "heatmap:")
    rows = [("accuracy", "none"), ("ece", "none"), ("ece", "temperature")]
    assert set(images) == {f"heatmap:{m}:{c}:{model}" for m, c in rows for model in MODELS}
    for metric, cal in rows:
        for model in MODELS:
            want = ds[metric].sel(model=model, calibration=cal).transpose(
                "corruption", "severity").values
            cells = images[f"heatmap:{metric}:{cal}:{model}"].get_array()
            assert cells.shape == (len(CORRUPTIONS), len(SEVERITIES))
            np.testing.assert_array_equal(np.ma.getmaskarray(cells), np.isnan(want))
            np.testing.assert_allclose(cells.compressed(), want[np.isfinite(want)], rtol=1e-12)
    # the missing member's cell carries no number (the others their value)
    model, corruption, severity = MISSING
    panel = images[f"heatmap:accuracy:none:{model}"].axes
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in panel.texts}
    assert (CORRUPTIONS.index(corruption), SEVERITIES.index(severity)) not in texts
    assert len(texts) == len(CORRUPTIONS) * len(SEVERITIES) - 1


def test_heatmap_rows_choose_metric_and_calibration():
    ds = _result()
    fig = plot_shift_heatmap(ds, rows=(("brier", "temperature"),))
    images = _artists(fig, "heatmap:")
    assert set(images) == {f"heatmap:brier:temperature:{m}" for m in MODELS}
    with pytest.raises(InputError, match="calibration.*'platt'"):
        plot_shift_heatmap(ds, rows=(("ece", "platt"),))
    with pytest.raises(InputError, match="rows"):
        plot_shift_heatmap(ds, rows=(("sharpness", "none"),))


@pytest.mark.parametrize("calibration", CALIBRATIONS)
def test_scatter_points_are_the_accuracy_ece_pairs(calibration):
    ds = _result(natural=True)
    fig = plot_shift_acc_vs_ece(ds)
    for model in MODELS:
        acc = ds["accuracy"].sel(model=model, calibration=calibration).values.ravel()
        ece = ds["ece"].sel(model=model, calibration=calibration).values.ravel()
        ok = np.isfinite(acc) & np.isfinite(ece)
        points = _artists(fig, f"shifted:{calibration}:{model}")[
            f"shifted:{calibration}:{model}"]
        np.testing.assert_allclose(points.get_offsets(), np.c_[acc[ok], ece[ok]], rtol=1e-12)
        # the missing member is not a point (and no point sits at 0)
        assert len(points.get_offsets()) == ok.sum() < acc.size if model == MISSING[0] \
            else len(points.get_offsets()) == acc.size
        assert (np.asarray(points.get_offsets()) > 0).all()
        # sizes grow with the severity
        sizes = np.broadcast_to(points.get_sizes(), (ok.sum(),))
        sev = np.broadcast_to(np.array(SEVERITIES), (len(CORRUPTIONS), len(SEVERITIES)))
        assert (np.diff(sizes[np.argsort(sev.ravel()[ok], kind="stable")]) >= 0).all()
        clean = _artists(fig, f"clean:{calibration}:{model}")[f"clean:{calibration}:{model}"]
        np.testing.assert_allclose(clean.get_offsets(), [[
            float(ds["clean_accuracy"].sel(model=model, calibration=calibration)),
            float(ds["clean_ece"].sel(model=model, calibration=calibration))]])
        sets = _artists(fig, f"set:{calibration}:{model}")[f"set:{calibration}:{model}"]
        np.testing.assert_allclose(sets.get_offsets(), np.c_[
            ds["set_accuracy"].sel(model=model, calibration=calibration).values,
            ds["set_ece"].sel(model=model, calibration=calibration).values])


def test_a_result_without_the_optional_variables_still_plots(tmp_path):
    ds = _result(optional=False)
    assert "clean_accuracy" not in ds and "temperature" not in ds
    paths = draw_figures(ds, tmp_path)
    assert [p.name for p in paths] == FILES
    medians = _artists(plot_shift_boxes(ds), "median:")
    assert not any(k.endswith(":clean") for k in medians)  # no clean box without clean_*
    fig = plot_shift_acc_vs_ece(ds)
    assert not fig.findobj(lambda a: str(a.get_gid()).startswith(("clean:", "set:")))
    # one metric only: the figures of the others are skipped
    only_acc = ds[["accuracy"]]
    assert [p.name for p in draw_figures(only_acc, tmp_path / "acc")] == FILES[:2]
    # one calibration only
    unscaled = ds.sel(calibration=["none"])
    assert len(draw_figures(unscaled, tmp_path / "none")) == 3
    assert {k.split(":")[2] for k in _artists(plot_shift_boxes(unscaled), "median:")} == \
        {"none"}


def test_a_result_of_natural_shift_sets_only_draws_the_scatter(tmp_path):
    """score_shift of natural shift sets only: an empty corruption x severity grid."""
    ds = _result(natural=True).isel(corruption=slice(0, 0), severity=slice(0, 0))
    assert [p.name for p in draw_figures(ds, tmp_path)] == ["shift_acc_vs_ece.png"]
    fig = plot_shift_acc_vs_ece(ds)
    assert all(len(a.get_offsets()) == 0 for a in _artists(fig, "shifted:").values())
    assert len(_artists(fig, "set:")) == len(MODELS) * len(CALIBRATIONS)
    with pytest.raises(InputError, match="no corrupted members"):
        plot_shift_heatmap(ds)


def test_bad_inputs_name_the_argument():
    ds = _result()
    with pytest.raises(InputError, match="calibrations.*'platt'"):
        plot_shift_boxes(ds, calibrations=("platt",))
    with pytest.raises(InputError, match="metrics.*'sharpness'"):
        plot_shift_boxes(ds, metrics=("sharpness",))
    with pytest.raises(InputError, match="'ece'"):
        plot_shift_acc_vs_ece(ds.drop_vars("ece"))
    other = ds.copy()
    other.attrs["protocol"] = "selective"
    with pytest.raises(InputError, match="protocol 'shift'.*'selective'"):
        draw_figures(other, "unused")


def _cache(folder, model, dataset, n_right, **attrs):
    """A 2-class cache of 10 samples whose first ``n_right`` are predicted right."""
    labels = np.array([0, 1] * 5)
    predicted = np.where(np.arange(10) < n_right, labels, 1 - labels)
    logits = np.zeros((10, 2))
    logits[np.arange(10), predicted] = 2.0
    attrs = {"model": model, "dataset_name": dataset, "mode": "plain", "pass_index": 0,
             "eval_set": "folder", "role": "clean", **attrs}
    if dataset == "val":  # declared the calibration set (test: a clean set's default, test)
        attrs.setdefault("set_role", "calibration")
    write_dataset(cache_dataset(logits, labels, samples=[f"s{i}.png" for i in range(10)],
                                classes=["a", "b"], attrs=attrs),
                  folder / f"{cache_key(model, dataset, 'plain', 0)}.nc")


def test_uqvision_plot_shift_draws_a_scored_result(tmp_path, capsys):
    caches = tmp_path / "caches"
    caches.mkdir()
    for model, right in (("m1", 7), ("m2", 9)):
        _cache(caches, model, "val", right - 2)  # wrong on some of the temperature's images
        _cache(caches, model, "test", right)
        for c in ("fog", "noise"):
            for s in (1, 3):
                if (model, c, s) != ("m2", "noise", 3):  # a missing member
                    _cache(caches, model, f"imagenet-c-{c}-{s}", right - s, role="shifted",
                           eval_set="imagenet-c", eval_member=f"{c}-{s}", corruption=c,
                           severity=s)
    scores = write_dataset(score_shift(caches), tmp_path / "shift.nc")
    assert main(["plot", "--shift", str(scores), "--out", str(tmp_path / "fig")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "fig" / f) for f in FILES]
    assert all((tmp_path / "fig" / f).stat().st_size > 0 for f in FILES)


def test_the_legend_gives_each_models_mce_to_three_decimals():
    """An mCE of 1.002 (a model a hair worse than the baseline) reads 1.002, not 1: the
    legend's three significant figures used to round it away."""
    ds = _result().assign(mean_corruption_error=("model", [1.002, 0.8]))
    fig = plot_shift_boxes(ds, metrics=("ece",))
    texts = [t.get_text() for legend in fig.legends + [a.get_legend() for a in fig.axes]
             if legend is not None for t in legend.get_texts()]
    assert "vanilla (mCE 1.002)" in texts and "deep_ensemble (mCE 0.800)" in texts


@pytest.mark.parametrize("n_models", [1, 2])
def test_the_legend_is_clear_of_every_title_and_label(n_models):
    """The figure's legend and the panels' titles and labels do not overlap once drawn (to the
    panels' right, the legend ran over the first title, which is wider than its panel)."""
    ds = _result().isel(model=slice(0, n_models))
    fig = plot_shift_boxes(ds)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)  # constrained layout places everything at draw time
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    assert len(texts) == 3 * len([m for m in BOX_METRICS if m in ds])
    for text in texts:
        assert not box.overlaps(text.get_window_extent(renderer)), text.get_text()
    for ax in fig.axes:  # nor any panel
        assert not box.overlaps(ax.get_window_extent(renderer))
