"""The Selective paper's analyses (issue 13 item 3) equal direct computations on a hand-made
results file."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import xarray as xr
from scipy.stats import kendalltau, spearmanr
from uqmetrics import read_dataset, write_dataset

from uqvision.protocols.selective.analysis import (
    family_correlations,
    improvements,
    method_comparisons,
    metric_disagreement,
    paired_comparisons,
    summarize_temperature_effect,
    teacher_comparisons,
    temperature_effect,
)

# model, method, base_model, family, base_architecture, distillation, label_smoothing, params
ROWS = [
    ("a_plain", "softmax", "a_plain", "A", "a", "no", "no", 10),
    ("a_dist", "softmax", "a_dist", "A", "a", "yes", "no", 10),
    ("a_ls", "softmax", "a_ls", "A", "a", "no", "yes", 10),
    ("a_big", "softmax", "a_big", "A", "a_big", "no", "no", 40),
    ("b_plain", "softmax", "b_plain", "B", "b", "no", "no", 20),
    ("b_dist", "softmax", "b_dist", "B", "b", "yes", "no", 20),
    ("b_odd", "softmax", "b_odd", "B", "b", "unknown", "no", 25),
    ("a_plain+mc_dropout", "mc_dropout", "a_plain", "A", "a", "no", "no", 10),
]
#                 none: accuracy auroc ece | temperature: auroc ece, T
VALUES = {
    "a_plain": (0.70, 0.80, 0.10, 0.82, 0.05, 0.8),
    "a_dist": (0.72, 0.85, 0.04, 0.85, 0.03, 1.1),
    "a_ls": (0.71, 0.78, 0.06, 0.79, 0.07, 0.9),
    "a_big": (0.80, 0.83, 0.12, 0.84, 0.04, 1.3),
    "b_plain": (0.60, 0.81, 0.20, 0.80, 0.02, 1.5),
    "b_dist": (0.65, 0.84, 0.08, 0.86, 0.05, 0.7),
    "b_odd": (0.66, 0.79, 0.09, 0.79, 0.09, 1.0),
    "a_plain+mc_dropout": (0.69, 0.77, np.nan, 0.78, np.nan, 0.9),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> xr.Dataset:
    """A selective result as ``score_selective`` + metadata write it, round-tripped to disk."""
    models = [r[0] for r in ROWS]
    v = np.array([VALUES[m] for m in models])
    none_temp = lambda i, j: np.stack([v[:, i], v[:, j]], axis=1)
    ds = xr.Dataset(
        {"accuracy": (("model", "calibration"), none_temp(0, 0)),
         "auroc": (("model", "calibration"), none_temp(1, 3)),
         "ece": (("model", "calibration"), none_temp(2, 4)),
         "temperature": (("model", "calibration"), np.stack([np.ones(len(v)), v[:, 5]], 1))},
        coords={"model": models, "calibration": ["none", "temperature"],
                "method": ("model", [r[1] for r in ROWS]),
                "base_model": ("model", [r[2] for r in ROWS]),
                "family": ("model", [r[3] for r in ROWS]),
                "base_architecture": ("model", [r[4] for r in ROWS]),
                "distillation": ("model", [r[5] for r in ROWS]),
                "label_smoothing": ("model", [r[6] for r in ROWS]),
                "metadata_key": ("model", [f"k.{r[0]}" for r in ROWS]),
                "teacher": ("model", ["k.a_big" if r[5] == "yes" else "" for r in ROWS]),
                "pretraining_data": ("model", ["none"] * len(ROWS)),
                "adversarial_training": ("model", ["no"] * len(ROWS)),
                "supervision": ("model", ["supervised"] * len(ROWS)),
                "params": ("model", np.array([r[7] for r in ROWS], float)),
                "input_size": ("model", np.full(len(ROWS), 32.0))})
    ds["auroc"].attrs["greater_is_better"] = 1
    ds["ece"].attrs["greater_is_better"] = 0
    path = write_dataset(ds, tmp_path_factory.mktemp("res") / "selective.nc")
    return read_dataset(path)


def test_distillation_pairs(results):
    out = paired_comparisons(results, "distillation", metrics=("auroc", "ece"))
    got = sorted(zip(out["treated"].values, out["baseline"].values, strict=True))
    # a_ls differs in label smoothing, a_big in base architecture, b_odd's regime is unknown
    assert got == [("a_dist", "a_plain"), ("b_dist", "b_plain")]
    for i in range(out.sizes["pair"]):
        t, b = str(out["treated"].values[i]), str(out["baseline"].values[i])
        assert out["delta_auroc"].values[i] == pytest.approx(VALUES[t][1] - VALUES[b][1])
        assert out["improvement_auroc"].values[i] == pytest.approx(VALUES[t][1] - VALUES[b][1])
        # ECE is lower-is-better: the improvement is the decrease
        assert out["improvement_ece"].values[i] == pytest.approx(VALUES[b][2] - VALUES[t][2])
    assert list(out["value"].values) == ["yes", "yes"]


def test_pairs_at_temperature_and_other_regime(results):
    out = paired_comparisons(results, "label_smoothing", metrics=("auroc",),
                             calibration="temperature")
    assert list(out["treated"].values) == ["a_ls"] and list(out["baseline"].values) == ["a_plain"]
    assert out["delta_auroc"].item() == pytest.approx(0.79 - 0.82)
    # without matching the other regimes, the distilled model is a baseline too
    loose = paired_comparisons(results, "distillation", metrics=("auroc",), match=())
    assert ("a_dist", "a_ls") in set(zip(loose["treated"].values, loose["baseline"].values,
                                         strict=True))
    none = paired_comparisons(results, "adversarial_training", metrics=("auroc",))
    assert none.sizes["pair"] == 0


def test_pairs_validation(results):
    with pytest.raises(ValueError, match="regime must be one of"):
        paired_comparisons(results, "family")
    with pytest.raises(ValueError, match="not in the result"):
        paired_comparisons(results, "distillation", metrics=("nll",))
    with pytest.raises(ValueError, match="lacks coords"):
        paired_comparisons(results.drop_vars("base_architecture"), "distillation")


def test_teacher_comparisons(results):
    out = teacher_comparisons(results, metrics=("auroc", "ece"))
    assert sorted(out["treated"].values) == ["a_dist", "b_dist"]
    assert set(out["baseline"].values) == {"a_big"}
    i = list(out["treated"].values).index("b_dist")
    assert out["delta_auroc"].values[i] == pytest.approx(0.84 - 0.83)
    assert out["improvement_ece"].values[i] == pytest.approx(0.12 - 0.08)


def test_mc_dropout_comparison(results):
    out = method_comparisons(results, metrics=("accuracy", "auroc"))
    assert list(out["treated"].values) == ["a_plain+mc_dropout"]
    assert out["delta_auroc"].item() == pytest.approx(0.77 - 0.80)
    assert out["delta_accuracy"].item() == pytest.approx(0.69 - 0.70)


def test_temperature_effect(results):
    eff = temperature_effect(results)
    soft = [r[0] for r in ROWS if r[1] == "softmax"]
    assert list(eff["model"].values) == soft
    for i, m in enumerate(soft):
        assert eff["temperature"].values[i] == VALUES[m][5]
        assert eff["delta_auroc"].values[i] == pytest.approx(VALUES[m][3] - VALUES[m][1])
        assert eff["improvement_ece"].values[i] == pytest.approx(VALUES[m][2] - VALUES[m][4])
    summary = summarize_temperature_effect(eff)
    gain = np.array([VALUES[m][3] - VALUES[m][1] for m in soft])
    t = np.array([VALUES[m][5] for m in soft])
    assert summary["auroc"]["n"] == len(soft)
    assert summary["auroc"]["fraction_improved"] == pytest.approx(np.mean(gain > 0))
    assert summary["auroc"]["spearman_t"] == pytest.approx(spearmanr(t, gain).statistic)
    assert summary["auroc"]["fraction_improved_t_below_1"] == pytest.approx(
        np.mean(gain[t < 1] > 0))
    assert summary["auroc"]["fraction_improved_t_above_1"] == pytest.approx(
        np.mean(gain[t > 1] > 0))
    assert summary["ece"]["median_improvement"] == pytest.approx(
        np.median([VALUES[m][2] - VALUES[m][4] for m in soft]))


def test_family_correlations(results):
    out = family_correlations(results, [("auroc", "accuracy"), ("ece", "params")], min_models=3)
    assert list(out["group"].values) == ["all", "A", "B"]
    soft = [r for r in ROWS if r[1] == "softmax"]
    for group in ("all", "A", "B"):
        rows = [r for r in soft if group in ("all", r[3])]
        acc = [VALUES[r[0]][0] for r in rows]
        auroc = [VALUES[r[0]][1] for r in rows]
        assert out["spearman"].sel(group=group, pair="auroc~accuracy").item() == pytest.approx(
            spearmanr(auroc, acc).statistic)
        assert out["n"].sel(group=group, pair="auroc~accuracy").item() == len(rows)
    # B's params: 20, 20, 25 with ece 0.20, 0.08, 0.09
    assert out["spearman"].sel(group="B", pair="ece~params").item() == pytest.approx(
        spearmanr([0.20, 0.08, 0.09], [20, 20, 25]).statistic)
    few = family_correlations(results, [("auroc", "accuracy")], min_models=4)
    assert math.isnan(few["spearman"].sel(group="B").item())  # 3 models < 4
    by2 = family_correlations(results, [("auroc", "accuracy")], by=("family", "distillation"))
    assert "A / no" in by2["group"].values


def test_metric_disagreement(results):
    out = metric_disagreement(results, "auroc", "ece")
    soft = [r[0] for r in ROWS if r[1] == "softmax"]
    a = np.array([VALUES[m][1] for m in soft])
    b = -np.array([VALUES[m][2] for m in soft])  # -ECE: larger is better
    discordant = [np.sign(a[i] - a[j]) != np.sign(b[i] - b[j])
                  for i, j in itertools.combinations(range(len(soft)), 2)
                  if a[i] != a[j] and b[i] != b[j]]
    assert out["discordant_fraction"] == pytest.approx(np.mean(discordant))
    assert out["spearman"] == pytest.approx(spearmanr(a, b).statistic)
    assert out["kendall"] == pytest.approx(kendalltau(a, b).statistic)
    assert out["best_auroc"] == "a_dist" and out["best_ece"] == "a_dist"
    assert out["same_best"] is True
    at_t = metric_disagreement(results, "auroc", "ece", calibration="temperature")
    assert at_t["best_auroc"] == "b_dist" and at_t["best_ece"] == "b_plain"
    assert at_t["same_best"] is False


def test_improvements_table(results):
    out = improvements(results, metrics=("auroc", "ece"))
    tech = list(out["technique"].values)
    assert tech.count("distillation") == 2 and tech.count("label_smoothing") == 1
    assert tech.count("temperature_scaling") == 7 and tech.count("mc_dropout") == 1
    mc = out.isel(entry=tech.index("mc_dropout"))
    assert mc["improvement_auroc"].item() == pytest.approx(0.77 - 0.80)
    assert math.isnan(mc["improvement_ece"].item())
    ts = out.isel(entry=np.flatnonzero(out["technique"].values == "temperature_scaling"))
    np.testing.assert_allclose(ts["improvement_auroc"].values,
                               temperature_effect(results)["improvement_auroc"].values)


def test_temperature_effect_compares_the_same_samples(results):
    """A file scored by the official rule (``none`` on every sample, ``temperature`` on the
    held-out ones): the effect of T is ``temperature`` − ``none_heldout`` (same samples), and
    ``paired=False`` gives the official code's unpaired difference (issue 25 item 5)."""
    shift = 0.01 * np.arange(1, results.sizes["model"] + 1)  # none on the held-out samples
    metrics = ["accuracy", "auroc", "ece"]
    held = np.stack([results[m].sel(calibration="none").values + shift for m in metrics], 1)
    ds = results.assign_coords(sample_set=("calibration", ["all", "heldout"]),
                               metric=metrics)
    ds["none_heldout"] = (("model", "metric"), held)
    soft = [r[0] for r in ROWS if r[1] == "softmax"]
    paired = temperature_effect(ds)
    assert paired.attrs["paired"] == 1
    for i, m in enumerate(soft):
        j = [r[0] for r in ROWS].index(m)
        assert paired["delta_auroc"].values[i] == pytest.approx(
            VALUES[m][3] - (VALUES[m][1] + shift[j]))
        assert paired["improvement_ece"].values[i] == pytest.approx(
            VALUES[m][2] + shift[j] - VALUES[m][4])
    unpaired = temperature_effect(ds, paired=False)
    np.testing.assert_allclose(unpaired["delta_auroc"].values,
                               [VALUES[m][3] - VALUES[m][1] for m in soft])
    ts = improvements(ds, metrics=("auroc",))
    ts = ts.isel(entry=np.flatnonzero(ts["technique"].values == "temperature_scaling"))
    np.testing.assert_allclose(ts["improvement_auroc"].values,
                               paired["improvement_auroc"].values)
    with pytest.raises(ValueError, match="different samples and has no none_heldout"):
        temperature_effect(ds.drop_vars("none_heldout"))
