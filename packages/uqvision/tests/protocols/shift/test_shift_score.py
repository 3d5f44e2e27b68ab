"""The shift protocol's scores (uqvision.protocols.shift.score) on synthetic caches with
values checked by hand, and its smoke run's result file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import uqmetrics
from uqmetrics import InputError, write_dataset
from uqmetrics.metrics.calibration import fit_temperature
from uqmetrics.metrics.shift import mean_corruption_error, relative_mean_corruption_error

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.shift.score import SHIFT_METRICS, ShiftConfig, score_shift

CLASSES = ["a", "b"]
N = 10
LABELS = np.array([0, 1] * (N // 2))


def _logits(n_right: int, margin: float = 2.0) -> np.ndarray:
    """Logits of N samples whose first ``n_right`` are predicted right."""
    right = np.where(np.arange(N) < n_right, LABELS, 1 - LABELS)
    z = np.zeros((N, 2))
    z[np.arange(N), right] = margin
    return z


def _write(folder, model, dataset, logits, *, role="clean", eval_set="folder",
           corruption="", severity=0, mode="plain", pass_index=0, **extra_attrs):
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": pass_index,
             "eval_set": eval_set, "role": role, **extra_attrs}
    if dataset == "val":  # declared the calibration set (test: a clean set's default, test)
        attrs.setdefault("set_role", "calibration")
    if corruption:
        attrs.update(eval_member=f"{corruption}-{severity}", corruption=corruption,
                     severity=severity)
    ds = cache_dataset(logits, LABELS, samples=[f"s{i}.png" for i in range(N)],
                       classes=CLASSES, attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, pass_index)}.nc")


#: model -> (right on val, right on test, {(corruption, severity): right}); the temperature
#: is fitted on val samples 2 3 4 6 7 (seed 0), of which each model gets one or two wrong (all
#: right would put it on the search's bound 0.01, which is refused)
RIGHT = {"m1": (6, 9, {("fog", 1): 7, ("fog", 2): 5, ("noise", 1): 6, ("noise", 2): 4}),
         "m2": (7, 9, {("fog", 1): 9, ("fog", 2): 8, ("noise", 1): 8, ("noise", 2): 6})}


def _caches(folder, models=("m1", "m2"), clean=True):
    folder.mkdir(parents=True, exist_ok=True)
    for m in models:
        val, test, shifted = RIGHT[m]
        if clean:
            _write(folder, m, "val", _logits(val))
            _write(folder, m, "test", _logits(test))
        for (c, s), k in shifted.items():
            _write(folder, m, f"imagenet-c-{c}-{s}", _logits(k), role="shifted",
                   eval_set="imagenet-c", corruption=c, severity=s)
    return folder


def test_accuracy_per_severity_and_clean_by_hand(tmp_path):
    ds = score_shift(_caches(tmp_path / "c"), ShiftConfig(calibration_size=0.5))
    assert list(ds["model"].values) == ["m1", "m2"]
    assert list(ds["corruption"].values) == ["fog", "noise"]
    assert list(ds["severity"].values) == [1, 2]
    for m, (_, test, shifted) in RIGHT.items():
        for (c, s), k in shifted.items():
            for cal in ("none", "temperature"):  # a temperature never moves the arg-max
                assert ds["accuracy"].sel(model=m, corruption=c, severity=s,
                                          calibration=cal) == pytest.approx(k / N)
        assert ds["clean_accuracy"].sel(model=m).values == pytest.approx([test / N] * 2)
    assert (ds["n_calibration"].values == N // 2).all()
    assert ds.attrs["protocol"] == "shift"


def test_temperature_one_equals_unscaled_and_fitted_on_clean_val(tmp_path, monkeypatch):
    from uqvision.protocols.shift import score

    caches = _caches(tmp_path / "c")
    fitted = score_shift(caches)
    # the temperature is the one fitted on the model's held-out val half: the same half for
    # every model (a function of the seed and the sample count only)
    fit = np.sort(np.random.default_rng(0).permutation(N)[:N // 2])
    for m in ("m1", "m2"):
        z = _logits(RIGHT[m][0])
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        assert fitted["temperature"].sel(model=m) == pytest.approx(
            fit_temperature(logp[fit], LABELS[fit]), rel=1e-6)
    monkeypatch.setattr(score, "fit_predictor_temperature", lambda *args: 1.0)
    ds = score_shift(caches)
    for name in SHIFT_METRICS:
        for v in (name, f"clean_{name}"):
            np.testing.assert_allclose(ds[v].sel(calibration="temperature"),
                                       ds[v].sel(calibration="none"), rtol=1e-9)
            np.testing.assert_allclose(ds[v].sel(calibration="none"),
                                       fitted[v].sel(calibration="none"), rtol=1e-12)


def test_mce_against_a_baseline_by_hand(tmp_path):
    ds = score_shift(_caches(tmp_path / "c"), ShiftConfig(baseline="m1"))

    def errors(m):
        shifted = RIGHT[m][2]
        return np.array([[1 - shifted[c, s] / N for s in (1, 2)] for c in ("fog", "noise")])

    e1, e2 = errors("m1"), errors("m2")
    assert ds["mean_corruption_error"].sel(model="m1") == pytest.approx(1.0)
    assert ds["mean_corruption_error"].sel(model="m2") == pytest.approx(
        mean_corruption_error(e2, e1))
    # by hand: fog (0.1 + 0.2) / (0.3 + 0.5), noise (0.2 + 0.4) / (0.4 + 0.6)
    assert ds["mean_corruption_error"].sel(model="m2") == pytest.approx(
        ((0.3 / 0.8) + (0.6 / 1.0)) / 2)
    assert ds["relative_mean_corruption_error"].sel(model="m2") == pytest.approx(
        relative_mean_corruption_error(e2, 0.1, e1, 0.1))
    assert ds["mean_corruption_error"].attrs["greater_is_better"] == 0
    assert "mean_corruption_error" not in score_shift(tmp_path / "c")


def test_mce_leaves_out_imagenet_c_held_out_corruptions(tmp_path):
    """Hendrycks & Dietterich (2019): mCE is the mean CE over the 15 benchmark corruptions;
    the 4 extra ones (speckle_noise, gaussian_blur, spatter, saturate) are for validation and
    never enter it, even where every model has them at every severity."""
    folder = _caches(tmp_path / "c")
    for m, k in (("m1", 2), ("m2", 9)):  # far from fog/noise: would move the mCE
        for s in (1, 2):
            _write(folder, m, f"imagenet-c-speckle_noise-{s}", _logits(k), role="shifted",
                   eval_set="imagenet-c", corruption="speckle_noise", severity=s)
    ds = score_shift(folder, ShiftConfig(baseline="m1"))
    assert "speckle_noise" in ds["corruption"].values  # scored, just not in the mCE
    assert ds["mean_corruption_error"].sel(model="m2") == pytest.approx(
        ((0.3 / 0.8) + (0.6 / 1.0)) / 2)
    assert json.loads(ds.attrs["mce_corruptions"]) == ["fog", "noise"]
    assert "speckle_noise" in ds.attrs["notes"]


def test_several_passes_average_the_softmax(tmp_path):
    folder = _caches(tmp_path / "c", models=("m1",))
    # m3: two TTA passes whose average softmax equals m1's plain caches on each set
    for dataset, k, extra in [("val", RIGHT["m1"][0], {}), ("test", RIGHT["m1"][1], {})] + [
            (f"imagenet-c-{c}-{s}", k, {"role": "shifted", "eval_set": "imagenet-c",
                                         "corruption": c, "severity": s})
            for (c, s), k in RIGHT["m1"][2].items()]:
        z = _logits(k)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        a, b = p + 0.05 * np.array([1, -1]), p - 0.05 * np.array([1, -1])
        _write(folder, "m3", dataset, np.stack([np.log(a), np.log(b)]), mode="tta", **extra)
    ds = score_shift(folder)
    for v in ("accuracy", "nll", "brier", "clean_nll"):
        np.testing.assert_allclose(ds[v].sel(model="m3", calibration="none"),
                                   ds[v].sel(model="m1", calibration="none"), rtol=1e-5)


def test_relative_mce_is_nan_with_a_warning_when_the_baseline_is_not_degraded(tmp_path):
    folder = _caches(tmp_path / "c")
    # baseline m0: 8 of 10 right on clean test, 9 under every corruption (error 0.1 < 0.2)
    _write(folder, "m0", "val", _logits(7))
    _write(folder, "m0", "test", _logits(8))
    for (c, s) in RIGHT["m1"][2]:
        _write(folder, "m0", f"imagenet-c-{c}-{s}", _logits(9), role="shifted",
               eval_set="imagenet-c", corruption=c, severity=s)
    with pytest.warns(uqmetrics.UndefinedMetricWarning, match="relative mCE is undefined"):
        ds = score_shift(folder, ShiftConfig(baseline="m0"))
    assert np.isnan(ds["relative_mean_corruption_error"].values).all()
    # mCE is still defined: m0's errors are 0.1 everywhere, m1's fog 0.3 + 0.5, noise 0.4 + 0.6
    assert ds["mean_corruption_error"].sel(model="m1") == pytest.approx(
        ((0.8 / 0.2) + (1.0 / 0.2)) / 2)


# ------------------------------------------------------------------------ UQ methods' rows

#: Each member's probability of the true class on the 10 samples (2 classes), the same on the
#: val, test and fog-1 caches. Right where > 0.5 (a tie [0.5, 0.5] predicts class 0):
#:   A: 0.9 0.8 . 0.6 . 0.7 . 0.55 0.9 .      6 of 10
#:   B: 0.6 . 0.8 . 0.7 . 0.9 . . 0.65        5 of 10 (sample 7: a tie, label 1 -> wrong)
PA = np.array([0.9, 0.8, 0.3, 0.6, 0.4, 0.7, 0.2, 0.55, 0.9, 0.45])
PB = np.array([0.6, 0.1, 0.8, 0.3, 0.7, 0.2, 0.9, 0.5, 0.3, 0.65])
#: the ensemble's mean, by hand: right on samples 0, 2, 4, 6, 7, 8, 9 -> 7 of 10
ENS = np.array([0.75, 0.45, 0.55, 0.45, 0.55, 0.45, 0.55, 0.525, 0.6, 0.55])
#: seed 3 fits the temperatures on samples 0 1 2 6 9, where A, B and the ensemble are each
#: right and wrong (seed 0's 2 3 4 6 7 leave A and its MC-dropout twin below chance: T on the
#: search's bound 100, refused)
SEED3 = ShiftConfig(seed=3)


def _probs_of_true(q: np.ndarray) -> np.ndarray:
    """(N, 2) probabilities with ``q`` on each sample's label."""
    p = np.empty((N, 2))
    p[np.arange(N), LABELS] = q
    p[np.arange(N), 1 - LABELS] = 1 - q
    return p


def _member(folder, model, q, **attrs):
    z = np.log(_probs_of_true(q))
    for dataset, extra in (("val", {}), ("test", {}),
                           ("imagenet-c-fog-1", {"role": "shifted", "eval_set": "imagenet-c",
                                                 "corruption": "fog", "severity": 1})):
        _write(folder, model, dataset, z, **extra, **attrs)


def test_deep_ensemble_members_are_scored_as_one_predictor_by_hand(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    # the members of one uqvision train --members 2 run (its ensemble id)
    run = {"method": "deep_ensemble", "ensemble": "r1", "ensemble_size": 2}
    _member(folder, "de_s0", PA, run="de_s0", **run)
    _member(folder, "de_s1", PB, run="de_s1", **run)
    _member(folder, "single", PA)  # no method: a model only
    # a member of another run under TTA is another predictor: alone in its run and mode, no
    # ensemble row of its own
    _member(folder, "de_s2", PB, run="de_s2", mode="tta",
            **{**run, "ensemble": "r2"})
    ds = score_shift(folder, SEED3)
    assert ds["model"].values.tolist() == ["de_s0", "de_s1", "de_s2", "single",
                                           "deep_ensemble[2]"]
    assert ds["kind"].values.tolist() == ["single"] * 4 + ["ensemble"]
    assert ds["members"].values.tolist() == [1, 1, 1, 1, 2]
    assert ds["mode"].values.tolist() == ["plain", "plain", "tta", "plain", "plain"]
    assert json.loads(ds.attrs["ensemble_members"]) == {"deep_ensemble[2]": ["de_s0", "de_s1"]}
    row = ds.sel(model="deep_ensemble[2]", calibration="none")
    for v in ("clean_accuracy", "accuracy"):
        assert float(row[v].squeeze()) == pytest.approx(0.7)
    assert float(ds["accuracy"].sel(model="de_s0", calibration="none").squeeze()) == 0.6
    assert float(ds["accuracy"].sel(model="de_s1", calibration="none").squeeze()) == 0.5
    assert float(row["clean_nll"]) == pytest.approx(-np.mean(np.log(ENS)))
    assert float(row["brier"].squeeze()) == pytest.approx(np.mean(2 * (1 - ENS) ** 2))
    # its temperature: fitted on the ensemble's own val probabilities, on the same half as
    # its members'
    fit = np.sort(np.random.default_rng(3).permutation(N)[:N // 2])
    logp = np.log(_probs_of_true(ENS))
    assert float(ds["temperature"].sel(model="deep_ensemble[2]")) == pytest.approx(
        fit_temperature(logp[fit], LABELS[fit]), rel=1e-6)
    assert float(ds["temperature"].sel(model="de_s0")) == pytest.approx(
        float(ds["temperature"].sel(model="single")), rel=1e-9)
    # an ensemble row can be the mCE baseline (its fog error equals its clean error: the
    # relative mCE is undefined); the same members declared (--ensemble) are the same row
    with pytest.warns(uqmetrics.UndefinedMetricWarning, match="relative mCE is undefined"):
        base = score_shift(folder, ShiftConfig(baseline="deep_ensemble[2]", seed=3))
    assert float(base["mean_corruption_error"].sel(model="de_s0")) == pytest.approx(0.4 / 0.3)
    pair = score_shift(folder, ShiftConfig(ensembles=["pair=de_s0,de_s1"], seed=3))
    assert pair["model"].values.tolist()[-2:] == ["deep_ensemble[2]", "pair"]
    np.testing.assert_array_equal(pair["clean_nll"].sel(model="pair"),
                                  pair["clean_nll"].sel(model="deep_ensemble[2]"))


def test_an_ensemble_row_named_like_a_model_is_refused(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    run = {"method": "deep_ensemble", "ensemble": "r1", "ensemble_size": 2}
    _member(folder, "de_s0", PA, **run)
    _member(folder, "de_s1", PB, **run)
    _member(folder, "deep_ensemble[2]", PA)
    with pytest.raises(InputError, match=r"ensemble row 'deep_ensemble\[2\]' .* has the name "
                                         r"of a model"):
        score_shift(folder)
    with pytest.raises(InputError, match=r"ensembles \(--ensemble\) '': not NAME=M1,M2"):
        ShiftConfig(ensembles=("",))


def test_mc_dropout_caches_are_scored_on_their_mean_softmax_by_hand(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    for dataset, extra in (("val", {}), ("test", {}),
                           ("imagenet-c-fog-1", {"role": "shifted", "eval_set": "imagenet-c",
                                                 "corruption": "fog", "severity": 1})):
        # one file, logits (pass, sample, class): two dropout passes, the true class's
        # probability PA + 0.05 and PA - 0.05 (mean PA)
        p = _probs_of_true(PA)
        shift = np.where(np.arange(2)[None, :] == LABELS[:, None], 0.05, -0.05)
        passes = np.stack([np.log(p + shift), np.log(p - shift)])
        _write(folder, "mc", dataset, passes, mode="mc_dropout", method="mc_dropout",
               **extra)
    ds = score_shift(folder, SEED3)
    assert ds["model"].values.tolist() == ["mc"] and ds["mode"].values.tolist() == ["mc_dropout"]
    row = ds.sel(model="mc", calibration="none")
    assert float(row["accuracy"].squeeze()) == 0.6
    assert float(row["nll"].squeeze()) == pytest.approx(-np.mean(np.log(PA)), rel=1e-6)
    assert float(row["clean_brier"]) == pytest.approx(np.mean(2 * (1 - PA) ** 2), rel=1e-6)


def test_a_model_without_clean_caches_is_named(tmp_path):
    folder = _caches(tmp_path / "c", models=("m1",))
    _caches(folder, models=("m2",), clean=False)
    with pytest.raises(InputError, match="'m2' has no caches of the calibration set 'val'"):
        score_shift(folder)


def test_bad_inputs(tmp_path):
    folder = _caches(tmp_path / "c")
    with pytest.raises(InputError, match="baseline model 'zz'"):
        score_shift(folder, ShiftConfig(baseline="zz"))
    with pytest.raises(InputError, match="calibration_size"):
        ShiftConfig(calibration_size=1.5)
    clean_only = tmp_path / "clean"
    clean_only.mkdir()
    _write(clean_only, "m1", "val", _logits(8))
    with pytest.raises(InputError, match="no caches of a shifted or relabelled evaluation set"):
        score_shift(clean_only)


def test_the_smoke_run_writes_a_shift_result(smoke_run):
    out, path = smoke_run("shift")
    ds = uqmetrics.read_result(path, protocol="shift")
    assert set(ds["calibration"].values) == {"none", "temperature"}
    assert ds.sizes["severity"] == 3 and ds.sizes["corruption"] == 3
    # the two deep-ensemble members, the MC-dropout network, then the ensemble of both members
    # as one predictor
    assert ds.sizes["model"] == 4 and ds["model"].values[-1] == "deep_ensemble[2]"
    assert ds["kind"].values.tolist() == ["single", "single", "single", "ensemble"]
    assert ds["mode"].values.tolist() == ["plain", "plain", "mc_dropout", "plain"]
    assert ds["members"].values.tolist() == [1, 1, 1, 2]
    assert json.loads(ds.attrs["ensemble_members"]) == {
        "deep_ensemble[2]": ds["model"].values[:2].tolist()}
    # the figures and findings of the vanilla member, MC dropout and the ensemble
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "shift_acc_vs_ece.png", "shift_boxes.png", "shift_heatmap.png"]
    findings = (out / "findings.md").read_text()
    assert findings.count("| calibration worsens with severity |") == 6  # 3 rows x 2 calibrations
    assert findings.count("| temperature scaling helps in distribution | every row (4) |") == 1
    assert findings.count("| temperature scaling does not survive shift |") == 3
    # vs vanilla and MC dropout: accuracy (un-scaled), NLL, Brier, ECE (x 2 calibrations)
    assert findings.count("| ensemble beats ") == 2 * 7
    assert findings.count("| MC dropout beats ") == findings.count("| MC dropout ranks ") == 7
    assert ds.sizes["shift_set"] == 0 and "real_accuracy" not in ds  # neither in the smoke run
    assert np.isfinite(ds["accuracy"].values).all()
    assert np.isfinite(ds["mean_corruption_error"].values).all()
