"""The shift protocol's scores (uqvision.protocols.shift.score) on synthetic caches with
values checked by hand, and its smoke run's result file."""

from __future__ import annotations

import numpy as np
import pytest
import uqmetrics
from uqmetrics import InputError, write_dataset
from uqmetrics.calibration import fit_temperature
from uqmetrics.shift import mean_corruption_error, relative_mean_corruption_error

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
           corruption="", severity=0, mode="plain", pass_index=0):
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": pass_index,
             "eval_set": eval_set, "role": role}
    if corruption:
        attrs.update(eval_member=f"{corruption}-{severity}", corruption=corruption,
                     severity=severity)
    ds = cache_dataset(logits, LABELS, samples=[f"s{i}.png" for i in range(N)],
                       classes=CLASSES, attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, pass_index)}.nc")


#: model -> (right on val, right on test, {(corruption, severity): right})
RIGHT = {"m1": (8, 9, {("fog", 1): 7, ("fog", 2): 5, ("noise", 1): 6, ("noise", 2): 4}),
         "m2": (9, 9, {("fog", 1): 9, ("fog", 2): 8, ("noise", 1): 8, ("noise", 2): 6})}


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
    # the temperature is the one fitted on the model's held-out val half
    rng = np.random.default_rng(0)
    for m in ("m1", "m2"):
        perm = rng.permutation(N)
        fit = np.sort(perm[:N // 2])
        z = _logits(RIGHT[m][0])
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        assert fitted["temperature"].sel(model=m) == pytest.approx(
            fit_temperature(logp[fit], LABELS[fit]), rel=1e-6)
    monkeypatch.setattr(score, "fit_temperature", lambda z, y: 1.0)
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


def test_a_model_without_clean_caches_is_named(tmp_path):
    folder = _caches(tmp_path / "c", models=("m1",))
    _caches(folder, models=("m2",), clean=False)
    with pytest.raises(InputError, match="'m2' has no clean caches"):
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
    with pytest.raises(InputError, match="no caches of a corrupted"):
        score_shift(clean_only)


def test_the_smoke_run_writes_a_shift_result(smoke_run):
    _out, path = smoke_run("shift")
    ds = uqmetrics.read_result(path, protocol="shift")
    assert set(ds["calibration"].values) == {"none", "temperature"}
    assert ds.sizes["model"] == 2 and ds.sizes["severity"] == 3 and ds.sizes["corruption"] == 3
    assert np.isfinite(ds["accuracy"].values).all()
    assert np.isfinite(ds["mean_corruption_error"].values).all()
