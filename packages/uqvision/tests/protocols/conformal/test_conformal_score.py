"""The conformal protocol's scores (uqvision.protocols.conformal.score) on synthetic caches,
checked against direct uqmetrics.metrics.conformal calls on the same arrays and by hand."""

from __future__ import annotations

import numpy as np
import pytest
from uqmetrics import InputError, write_dataset
from uqmetrics.metrics import conformal as cp
from uqmetrics.metrics.calibration import fit_temperature, softmax

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.conformal import score
from uqvision.protocols.conformal.score import (
    CONFORMAL_METHODS,
    TRIAL_STATS,
    ConformalConfig,
    ShortCalibrationWarning,
)
from uqvision.protocols.conformal.score import score_conformal as _score_conformal

CLASSES = ["a", "b", "c", "d"]
N_VAL, N_TEST = 60, 80


def _labels(n: int) -> np.ndarray:
    return np.arange(n) % len(CLASSES)


def _logits(n: int, seed: int, signal: float = 1.5) -> np.ndarray:
    """Logits of ``n`` images: every row distinct, the label's logit raised by ``signal``."""
    z = np.random.default_rng(seed).normal(size=(n, len(CLASSES)))
    z[np.arange(n), _labels(n)] += signal
    return z


def _write(folder, model, dataset, logits, *, role="clean", eval_set="folder", corruption="",
           severity=0, suffix=".png", mode="plain", **attrs):
    n = logits.shape[0]
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": 0,
             "eval_set": eval_set, "role": role, **attrs}
    if dataset == "val":  # declared the calibration set (test: a clean set's default, test)
        attrs.setdefault("set_role", "calibration")
    if corruption:
        attrs.update(eval_member=f"{corruption}-{severity}", corruption=corruption,
                     severity=severity)
    samples = [f"{CLASSES[y]}/img{i}{suffix}" for i, y in enumerate(_labels(n))]
    ds = cache_dataset(logits, _labels(n), samples=samples, classes=CLASSES, attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, 0)}.nc")


#: (corruption, severity) -> the signal of the corrupted copies of the test images
SHIFTS = {("noise", 1): 1.0, ("noise", 3): 0.2}


def _caches(folder, models=("m1", "m2"), *, test=True, shifted=False, natural=False,
            method=""):
    folder.mkdir(parents=True, exist_ok=True)
    for j, m in enumerate(models):
        # a method's models: the members of one uqvision train run
        extra = {"method": method, "ensemble": "r1", "ensemble_size": len(models)} \
            if method else {}
        _write(folder, m, "val", _logits(N_VAL, 10 + j), **extra)
        if test:
            _write(folder, m, "test", _logits(N_TEST, 20 + j), **extra)
        if shifted:
            for (c, s), signal in SHIFTS.items():
                _write(folder, m, f"imagenet-c-{c}-{s}", _logits(N_TEST, 30 + s + j, signal),
                       role="shifted", eval_set="imagenet-c", corruption=c, severity=s,
                       suffix=".JPEG", **extra)
        if natural:
            _write(folder, m, "v2", _logits(40, 50 + j, 0.5), role="shifted",
                   eval_set="imagenet-v2", **extra)
    return folder


CONFIG = ConformalConfig(trials=7, seed=3)


def score_conformal(caches, config=None):
    """``score_conformal`` on this module's small pools: a trial's draw of 30 to 40 images
    holds about 10 of each of the 4 classes, too few for some Mondrian thresholds at 0.1 and
    every one at 0.05 (9 and 19 needed), which it says (tests of the rule: test_wrong_scores_
    conformal.py)."""
    with pytest.warns(ShortCalibrationWarning, match="aps_mondrian at alpha"):
        return _score_conformal(caches, config)


def _kw(method):
    return {"aps_mondrian": {"score": "aps", "mondrian": True},
            "naive_deterministic": {"score": "naive", "randomized": False}}.get(
        method, {"score": method})


def test_clean_values_are_those_of_conformal_trials_on_the_same_arrays(tmp_path):
    ds = score_conformal(_caches(tmp_path / "c"), CONFIG)
    assert list(ds["method"].values) == list(CONFORMAL_METHODS)
    assert ds["alpha"].values.tolist() == [0.1, 0.05]
    assert list(ds["calibration"].values) == ["none", "temperature", "platt"]
    assert ds.attrs["protocol"] == "conformal" and int(ds.attrs["trials"]) == 7
    for j, m in enumerate(("m1", "m2")):
        p = softmax(_logits(N_TEST, 20 + j))  # the pool: the test caches
        n_cal = N_TEST // 2
        assert int(ds["n_cal"].sel(model=m)) == n_cal and int(ds["n_pool"].sel(model=m)) == N_TEST
        t = float(ds["temperature"].sel(model=m))
        platt = cp.trial_temperatures(p, _labels(N_TEST), n_cal=n_cal, trials=7, seed=3)
        assert float(ds["platt_temperature"].sel(model=m)) == pytest.approx(np.median(platt),
                                                                           rel=1e-6)
        for cal, q, temps in (("none", p, None), ("temperature", softmax(np.log(p),
                                                                         temperature=t), None),
                              ("platt", p, platt)):
            for method in CONFORMAL_METHODS:
                for alpha in (0.1, 0.05) if m == "m1" else (0.05,):  # (cheaper: m2 at one)
                    res = cp.conformal_trials(q, _labels(N_TEST), alpha=alpha, n_cal=n_cal,
                                              trials=7, seed=3, temperatures=temps,
                                              **_kw(method))
                    at = {"model": m, "method": method, "alpha": alpha, "calibration": cal}
                    for stat in TRIAL_STATS:
                        assert float(ds[stat].sel(at)) == pytest.approx(res[stat].mean(),
                                                                        rel=1e-6, abs=1e-12)
                        assert float(ds[f"{stat}_std"].sel(at)) == pytest.approx(
                            res[stat].std(), rel=1e-6, abs=1e-12)
                        assert float(ds[f"{stat}_median"].sel(at)) == pytest.approx(
                            np.median(res[stat]), rel=1e-6, abs=1e-12)
        assert float(ds["accuracy"].sel(model=m)) == pytest.approx(
            np.mean(p.argmax(1) == _labels(N_TEST)))
        assert float(ds["accuracy_median"].sel(model=m)) == pytest.approx(np.median(res["top1"]))
        assert float(ds["top5_accuracy_median"].sel(model=m)) == 1.0  # 4 classes


@pytest.fixture(scope="module")
def m1_result(tmp_path_factory):
    """One model's result (CONFIG), shared by the Table 1 baselines' tests."""
    return score_conformal(_caches(tmp_path_factory.mktemp("m1") / "c", models=("m1",)), CONFIG)


def test_naive_row_is_the_official_gcq_on_platt_temperatures(m1_result):
    """Issue 38, item 1: RAPS Table 1's Naive (experiments/table1.py -> conformal.gcq at
    tau = 1 - alpha, randomized, empty sets allowed), on the softmax tempered by a temperature
    fitted on each trial's calibration draw (``platt``; un-scaled: ``none``), written out by
    hand; the deterministic, never-empty Naive of before is ``naive_deterministic``."""
    ds = m1_result
    z, y, n_cal = _logits(N_TEST, 20), _labels(N_TEST), N_TEST // 2
    rng = np.random.default_rng(3)
    perms = cp.random_splits(N_TEST, n_cal, 7, rng)
    u = rng.uniform(size=(7, N_TEST))
    for alpha, cal_kind in ((0.1, "none"), (0.1, "platt"), (0.05, "platt")):
        cov, size, cov_det, size_det = [], [], [], []
        for t, row in enumerate(perms):
            cal, ev = row[:n_cal], row[n_cal:]
            temp = fit_temperature(np.log(softmax(z[cal])), y[cal]) if cal_kind == "platt" \
                else 1.0
            hits, sizes, hits_det, sizes_det = [], [], [], []
            for i, probs in zip(ev, softmax(z[ev], temperature=temp), strict=True):
                order = np.argsort(-probs, kind="stable")
                cumsum = np.cumsum(probs[order])
                k = int((cumsum <= 1 - alpha).sum()) + 1  # gcq's sizes_base
                v = (1 - alpha - (cumsum[k - 1] - probs[order][k - 1])) / probs[order][k - 1]
                kept = k - int(u[t, i] >= v)  # randomized: may be 0, an empty set
                hits.append(y[i] in order[:kept])
                sizes.append(kept)
                hits_det.append(y[i] in order[:k])
                sizes_det.append(k)
            cov.append(np.mean(hits))
            size.append(np.mean(sizes))
            cov_det.append(np.mean(hits_det))
            size_det.append(np.mean(sizes_det))
        at = {"model": "m1", "alpha": alpha, "calibration": cal_kind}
        naive = {"method": "naive", **at}
        assert float(ds["coverage"].sel(naive)) == pytest.approx(np.mean(cov))
        assert float(ds["mean_set_size"].sel(naive)) == pytest.approx(np.mean(size))
        assert float(ds["coverage_median"].sel(naive)) == pytest.approx(np.median(cov))
        det = {"method": "naive_deterministic", **at}
        assert float(ds["coverage"].sel(det)) == pytest.approx(np.mean(cov_det))
        assert float(ds["mean_set_size"].sel(det)) == pytest.approx(np.mean(size_det))
        assert float(ds["empty_fraction"].sel(det)) == 0.0  # never empty
        assert np.mean(size) < np.mean(size_det)  # randomization drops classes


def test_topk_row_is_the_official_fixed_set(m1_result):
    """Issue 38, item 2: Table 1's Top-K column (table1.trial, fixed_bool): k and rand_frac
    from the ranks of each trial's calibration draw, sizes k - 1 + (U > rand_frac)."""
    ds = m1_result
    p, y, n_cal = softmax(_logits(N_TEST, 20)), _labels(N_TEST), N_TEST // 2
    gt = (p > p[np.arange(N_TEST), y][:, None]).sum(axis=1)  # 0-based ranks, as gt_locs
    rng = np.random.default_rng(3)
    perms = cp.random_splits(N_TEST, n_cal, 7, rng)
    u = rng.uniform(size=(7, N_TEST))
    for alpha in (0.1, 0.05):
        cov, size = [], []
        for t, row in enumerate(perms):
            cal, ev = gt[row[:n_cal]], row[n_cal:]
            kstar = np.quantile(cal, 1 - alpha, method="higher") + 1
            frac = (((cal <= kstar - 1).mean() - (1 - alpha))
                    / ((cal <= kstar - 1).mean() - (cal <= kstar - 2).mean()))
            sizes = kstar - 1 + (u[t, ev] > frac)
            cov.append((gt[ev] <= sizes - 1).mean())
            size.append(sizes.mean())
        for cal in ("none", "platt"):  # a temperature changes no rank
            at = {"model": "m1", "method": "topk", "alpha": alpha, "calibration": cal}
            assert float(ds["coverage_median"].sel(at)) == pytest.approx(np.median(cov))
            assert float(ds["mean_set_size_median"].sel(at)) == pytest.approx(np.median(size))


def test_the_temperature_images_never_enter_a_conformal_split(tmp_path, monkeypatch):
    """With val caches only, the temperature is fitted on a fraction of val and the conformal
    pool is the rest: no image in both (rows identified by their distinct probabilities)."""
    from uqmetrics.metrics import calibration

    fitted, pooled = [], []
    real_fit, real_trials = calibration.fit_temperature, cp.conformal_calibrations
    monkeypatch.setattr(calibration, "fit_temperature",
                        lambda z, y, **kw: fitted.append(np.exp(z)) or real_fit(z, y, **kw))
    monkeypatch.setattr(cp, "conformal_calibrations",
                        lambda probs, labels, **kw: pooled.append(probs.p) or real_trials(
                            probs, labels, **kw))
    config = ConformalConfig(trials=3, temperature_size=0.25, alphas=(0.1,))
    ds = score_conformal(_caches(tmp_path / "c", models=("m1",), test=False), config)
    p = softmax(_logits(N_VAL, 10))

    def rows(arr):
        return {int(np.flatnonzero(np.isclose(p, r, rtol=1e-4).all(1))[0]) for r in arr}

    fit = rows(fitted[0])
    pool = rows(pooled[0])  # the un-scaled pool (the first call)
    assert len(fit) == 15 and len(pool) == N_VAL - 15 and not fit & pool
    assert fit | pool == set(range(N_VAL))
    assert int(ds["n_temperature"].sel(model="m1")) == 15
    assert int(ds["n_pool"].sel(model="m1")) == N_VAL - 15
    assert ds.attrs["pool_dataset"] == '{"m1": "val"}'
    fit_idx, rest = score._temperature_split(N_VAL, config)
    assert set(fit_idx) == fit and set(rest) == pool


def test_shift_rows_by_hand(tmp_path):
    """THR (not randomised) on the corrupted copies: each trial's threshold of the clean
    calibration draw (conformal_trials' qhat), evaluated on the copies of the other images."""
    ds = score_conformal(_caches(tmp_path / "c", models=("m1",), shifted=True, natural=True),
                         CONFIG)
    assert list(ds["corruption"].values) == ["noise"]
    assert ds["severity"].values.tolist() == [1, 3]
    assert list(ds["shift_set"].values) == ["v2"]
    p, y, n_cal = softmax(_logits(N_TEST, 20)), _labels(N_TEST), N_TEST // 2
    perms = cp.random_splits(N_TEST, n_cal, 7, np.random.default_rng(3))
    for alpha in (0.1, 0.05):
        qhat = cp.conformal_trials(p, y, score="thr", alpha=alpha, n_cal=n_cal, trials=7,
                                   seed=3)["qhat"]
        for (c, s), signal in SHIFTS.items():
            q = softmax(_logits(N_TEST, 30 + s, signal))
            cov, size = [], []
            for t in range(7):
                ev = np.sort(perms[t, n_cal:])  # the copies of the draw's images left out
                sets = (1.0 - q[ev]) <= qhat[t]
                cov.append(sets[np.arange(ev.size), y[ev]].mean())
                size.append(sets.sum(1).mean())
            at = {"model": "m1", "method": "thr", "alpha": alpha, "corruption": c,
                  "severity": s, "calibration": "none"}
            assert float(ds["shift_coverage"].sel(at)) == pytest.approx(np.mean(cov))
            assert float(ds["shift_coverage_std"].sel(at)) == pytest.approx(np.std(cov))
            assert float(ds["shift_mean_set_size"].sel(at)) == pytest.approx(np.mean(size))
        q, yv = softmax(_logits(40, 50, 0.5)), _labels(40)  # v2: new images, all evaluated
        cov = [((1.0 - q[np.arange(40), yv]) <= qhat[t]).mean() for t in range(7)]
        at = {"model": "m1", "method": "thr", "alpha": alpha, "shift_set": "v2",
              "calibration": "none"}
        assert float(ds["set_coverage"].sel(at)) == pytest.approx(np.mean(cov))
    # every method has its rows; coverage at the strongest shift falls below the clean one
    assert not np.isnan(ds["shift_coverage"].values).any()
    clean = ds["coverage"].sel({"method": "aps", "calibration": "none"})
    assert (ds["shift_coverage"].sel({"method": "aps", "severity": 3, "calibration": "none"})
            .isel(corruption=0) < clean).all()


def test_the_shift_calibration_is_that_of_conformal_trials(tmp_path):
    """The per-trial calibration the shifted sets use reproduces conformal_trials' coverage
    and sizes on the clean evaluation images (every method, un-scaled and Platt-scaled)."""
    p, y = softmax(_logits(N_TEST, 20)), _labels(N_TEST)
    n_cal = 30
    platt = cp.trial_temperatures(p, y, n_cal=n_cal, trials=7, seed=3)
    for temps in (None, platt):
        for method in CONFORMAL_METHODS:
            cal = cp.conformal_calibrations(
                p, y, **score._trial_args(method, 0.1, n_cal, CONFIG, temps))
            ev = cal.test
            sets = cp.calibrated_sets(cal, p, np.take_along_axis(cal.u, ev, axis=1), ev)
            res = cp.conformal_trials(p, y, alpha=0.1, n_cal=n_cal, trials=7, seed=3,
                                      temperatures=temps, **_kw(method))
            np.testing.assert_allclose(cp.coverage(sets, y[ev]), res["coverage"])
            np.testing.assert_allclose(cp.mean_set_size(sets), res["mean_set_size"])
            np.testing.assert_allclose(cal.qhat, res["qhat"])


def test_ensemble_rows_curve_and_class_coverage(tmp_path):
    ds = score_conformal(_caches(tmp_path / "c", method="deep_ensemble"), CONFIG)
    assert list(ds["model"].values) == ["m1", "m2", "deep_ensemble[2]"]
    p = (softmax(_logits(N_TEST, 20)) + softmax(_logits(N_TEST, 21))) / 2
    res = cp.conformal_trials(p, _labels(N_TEST), score="aps", alpha=0.1, n_cal=N_TEST // 2,
                              trials=7, seed=3)
    assert float(ds["coverage"].sel({"model": "deep_ensemble[2]", "method": "aps",
                                     "alpha": 0.1, "calibration": "none"})) == pytest.approx(res["coverage"].mean())
    curve = ds["curve_coverage"].sel(model="m1", curve_method="aps")
    assert float(curve.sel(curve_alpha=0.1)) == pytest.approx(float(
        ds["coverage"].sel({"model": "m1", "method": "aps", "alpha": 0.1,
                            "calibration": "none"})))
    cov = ds["class_coverage"].sel(model="m1").values
    assert cov.shape == (4,) and ((cov >= 0) & (cov <= 1)).all()
    # the class coverages, weighted by the classes' evaluation counts, are the mean coverage
    # (equal counts here: 20 images per class in the pool)
    perms = cp.random_splits(N_TEST, N_TEST // 2, 7, np.random.default_rng(3))
    counts = np.bincount(_labels(N_TEST)[perms[:, N_TEST // 2:]].ravel(), minlength=4)
    cov_m1 = cp.conformal_trials(softmax(_logits(N_TEST, 20)), _labels(N_TEST), score="aps",
                                 alpha=0.1, n_cal=N_TEST // 2, trials=7, seed=3)["coverage"]
    assert np.sum(cov * counts) / counts.sum() == pytest.approx(cov_m1.mean())


def test_bad_input_is_refused_naming_it(tmp_path):
    with pytest.raises(InputError, match="alphas"):
        ConformalConfig(alphas=(0.1, 1.5))
    with pytest.raises(InputError, match="trials"):
        ConformalConfig(trials=0)
    with pytest.raises(InputError, match="temperature_size"):
        ConformalConfig(temperature_size=1.0)
    with pytest.raises(InputError, match="n_cal"):
        _score_conformal(_caches(tmp_path / "c", models=("m1",)), ConformalConfig(n_cal=N_TEST))
    with pytest.raises(InputError, match="no set of role .test. or .calibration."):
        folder = tmp_path / "only_shifted"
        folder.mkdir()
        _write(folder, "m1", "v2", _logits(40, 1), role="shifted", eval_set="imagenet-v2")
        _score_conformal(folder, CONFIG)


def test_without_a_test_set_every_corrupted_image_is_evaluated(tmp_path):
    """The pool is val's rest: val and test share sample ids, so no corrupted image (a copy of
    a test image) is taken for a copy of a pool image."""
    config = ConformalConfig(trials=5, alphas=(0.1,))
    ds = score_conformal(_caches(tmp_path / "c", models=("m1",), test=False, shifted=True),
                         config)
    _, rest = score._temperature_split(N_VAL, config)
    p, y = softmax(_logits(N_VAL, 10))[rest], _labels(N_VAL)[rest]
    qhat = cp.conformal_trials(p, y, score="thr", alpha=0.1, n_cal=rest.size // 2, trials=5,
                               seed=0)["qhat"]
    q, yt = softmax(_logits(N_TEST, 31, SHIFTS["noise", 1])), _labels(N_TEST)
    cov = [((1.0 - q[np.arange(N_TEST), yt]) <= qh).mean() for qh in qhat]
    at = {"model": "m1", "method": "thr", "alpha": 0.1, "corruption": "noise", "severity": 1,
          "calibration": "none"}
    assert float(ds["shift_coverage"].sel(at)) == pytest.approx(np.mean(cov))
