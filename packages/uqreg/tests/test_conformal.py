"""Split-conformal methods and their exact conditional coverage (docs/conventions.md#r-6).

* the analytic conditional coverage ``Φ((u − f)/σ) − Φ((l − f)/σ)`` against a Monte-Carlo
  estimate, for hand-made intervals and for a study's own intervals;
* the conformal quantile's rank ⌈(n + 1)(1 − α)⌉ by hand, +inf beyond n;
* the marginal coverage of split conformal over noise draws, against its exact distribution;
* the configuration (n_cal, alpha, names), per-repetition seeding of the calibration points,
  the study's variables, and ``uqreg study --methods ...+cp_abs`` end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.special import ndtri

from uqreg import cli
from uqreg.conformal import (
    SCORES,
    calibrate,
    conditional_coverage,
    conformal_quantile,
    gaussian_interval,
)
from uqreg.engine import TrainConfig
from uqreg.methods import ConformalMethod, conformal_method_names, get_method, list_methods
from uqreg.study import StudyConfig, run_raw, run_study
from uqreg.tasks import get_task

TINY_TRAIN = TrainConfig(members=2, epochs=3, mc_samples=4, dtype="float64")


def _bonferroni_k(m: int, family_error: float = 1e-4) -> float:
    """Two-sided normal quantile k with P(any of m independent |Z| > k) <= family_error."""
    return float(ndtri(1 - family_error / (2 * m)))


# --- analytic conditional coverage -------------------------------------------------------------

def test_conditional_coverage_matches_monte_carlo():
    """Analytic ``P(y ∈ [l, u] | x)`` against the fraction of n = 400,000 draws y ~ N(f, σ²).

    The fraction is Binomial(n, p)/n with p the analytic value, so its standard error is
    ``SE = sqrt(p(1 − p)/n)`` (≤ 7.9e-4), and for n·p(1 − p) ≥ 400 (every case here) the
    normal approximation holds. With m cases, ``k = Φ⁻¹(1 − 10⁻⁴/(2m))`` bounds the chance that
    any correct case fails by 10⁻⁴ (Bonferroni); k follows from m, it is not tuned. Degenerate
    intervals (p exactly 0 or 1) have no sampling error and are checked exactly.
    """
    rng = np.random.default_rng(20261127)
    n = 400_000
    cases = [  # (low, high, f, sigma)
        (-1.96, 1.96, 0.0, 1.0), (-1.0, 2.5, 0.3, 0.75), (0.5, 0.9, 0.0, 0.2), (-np.inf, 1.0, 2.0, 3.0),
        (-4.0, np.inf, -3.0, 0.5), (10.0, 12.0, 11.5, 2.0), (-0.1, 0.1, 0.0, 0.05),
    ]
    k = _bonferroni_k(len(cases))
    for low, high, f, sigma in cases:
        p = float(conditional_coverage(low, high, f, sigma))
        y = f + sigma * rng.standard_normal(n)
        p_hat = np.mean((y >= low) & (y <= high))
        se = np.sqrt(p * (1 - p) / n)
        assert n * p * (1 - p) >= 400
        assert abs(p_hat - p) <= k * se, (low, high, f, sigma, p, p_hat, se)
    assert conditional_coverage(-np.inf, np.inf, 1.0, 2.0) == 1.0
    assert conditional_coverage(3.0, 2.0, 1.0, 2.0) == 0.0  # empty interval
    assert np.isnan(conditional_coverage(np.nan, 1.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="sigma must be a positive number, got 0.0"):
        conditional_coverage(0.0, 1.0, 0.0, 0.0)


def test_study_conditional_coverage_matches_monte_carlo():
    """The study's ``conditional_coverage`` of its own intervals (a conformal ensemble and the
    reference) at a few test points against draws ``y ~ N(truth, σ²)``; the standard error
    and k as in :func:`test_conditional_coverage_matches_monte_carlo` (m = every checked cell
    with 0 < p < 1), and the reference's coverage equals ``blr``'s interval's."""
    cfg = StudyConfig(task="sinusoid", complexities=(1,), methods=("blr", "ens+cp_abs", "ens+cp_std"),
                      repetitions=2, n_cal=40, alpha=0.1, train=TINY_TRAIN)
    ds = run_study(cfg, progress=False)
    sigma = ds.attrs["sigma"]
    pts = [0, 300, 500, 999]
    sub = ds.isel(recipe=0, complexity=0, point=pts)
    lo, hi = sub.interval_low.values, sub.interval_high.values  # (method, repetition, point)
    truth = sub.truth.values
    p = sub.conditional_coverage.values
    rng = np.random.default_rng(7)
    n = 200_000
    y = truth + sigma * rng.standard_normal((n, len(pts)))
    p_hat = np.mean((y[:, None, None, :] >= lo) & (y[:, None, None, :] <= hi), axis=0)
    ok = (p > 0) & (p < 1)
    assert ok.sum() >= 10
    k = _bonferroni_k(int(ok.sum()))
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(p_hat - p)[ok] <= k * se[ok])
    blr = ds.conditional_coverage.sel({"method": "blr"})
    ref = ds.reference_conditional_coverage.broadcast_like(blr).transpose(*blr.dims)
    np.testing.assert_allclose(blr.values, ref.values, atol=1e-12)
    np.testing.assert_allclose(ds.width_ratio.sel({"method": "blr"}), 1.0, rtol=1e-12)


# --- the conformal quantile -------------------------------------------------------------------

def test_conformal_quantile_rank_by_hand():
    """n = 5 scores: α = 0.5 → rank ⌈6·0.5⌉ = 3; α = 0.25 → ⌈4.5⌉ = 5; α = 0.1 → ⌈5.4⌉ = 6 > 5 →
    +inf. Vectorised over a leading axis. (α values chosen so (n + 1)(1 − α) is exact in binary.)"""
    s = np.array([[5.0, 1.0, 4.0, 2.0, 3.0], [50.0, 10.0, 40.0, 20.0, 30.0]])
    np.testing.assert_array_equal(conformal_quantile(s, 0.5), [3.0, 30.0])
    np.testing.assert_array_equal(conformal_quantile(s, 0.25), [5.0, 50.0])
    np.testing.assert_array_equal(conformal_quantile(s, 0.1), [np.inf, np.inf])
    np.testing.assert_array_equal(conformal_quantile(np.arange(8.0)[::-1], 0.25), 6.0)  # 9·0.75 = 6.75 → 7th of 0..7


def test_calibrate_nan_scores_give_nan_intervals():
    """A repetition whose calibration predictions are NaN (a diverged network) gets a NaN
    quantile and interval; the others are unaffected."""
    y = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    cal_mean = np.array([[0.0, 0.0, 0.0], [0.0, np.nan, 0.0]])
    low, high, q = calibrate(SCORES["cp_abs"], y, cal_mean, np.ones_like(y), np.zeros((2, 1)), np.ones((2, 1)), 0.5)
    assert q[0] == 2.0 and np.isnan(q[1]) and np.isnan(low[1]).all() and np.isnan(high[1]).all()


def test_calibrate_intervals_by_hand():
    """cp_abs: mean ± q with q the rank-3 |residual| (α = 0.5, n = 5); cp_std: mean ± q·std with
    q from |residual|/std."""
    y = np.array([[1.0, -2.0, 4.0, 0.5, 3.0]])
    cal_mean = np.zeros((1, 5))
    cal_std = np.array([[1.0, 1.0, 2.0, 0.5, 3.0]])
    mean, std = np.array([[10.0, 20.0]]), np.array([[1.0, 2.0]])
    low, high, q = calibrate(SCORES["cp_abs"], y, cal_mean, cal_std, mean, std, 0.5)
    assert q[0] == 2.0  # |r| = 1, 2, 4, 0.5, 3 → sorted 0.5, 1, 2, 3, 4
    np.testing.assert_array_equal(low, [[8.0, 18.0]])
    np.testing.assert_array_equal(high, [[12.0, 22.0]])
    low, high, q = calibrate(SCORES["cp_std"], y, cal_mean, cal_std, mean, std, 0.5)
    assert q[0] == 1.0  # |r|/std = 1, 2, 2, 1, 1 → sorted 1, 1, 1, 2, 2
    np.testing.assert_array_equal(low, [[9.0, 18.0]])
    np.testing.assert_array_equal(high, [[11.0, 22.0]])


# --- marginal coverage of split conformal ------------------------------------------------------

@pytest.mark.parametrize("base", ["blr", "ens"])
def test_split_conformal_marginal_coverage(base):
    """Split-conformal coverage over noise draws, against its exact distribution.

    Per repetition r the method is retrained on a fresh noise draw, calibrated on n fresh
    calibration points, and evaluated at M fresh test inputs x drawn like the training inputs,
    by the exact ``c_r = mean_x P(y ∈ I_r(x) | x)``. For continuous scores and
    ``k = ⌈(n + 1)(1 − α)⌉ ≤ n``, the coverage ``C_r = P(y ∈ I_r | training, calibration)`` is
    Beta(k, n + 1 − k) whatever the training data (Vovk 2012; Angelopoulos & Bates 2023, §3.2),
    so ``E C_r = k/(n + 1) ∈ [1 − α, 1 − α + 1/(n + 1))`` and
    ``Var C_r = k(n + 1 − k)/((n + 1)²(n + 2))``. Given C_r, ``c_r`` averages M values in [0, 1]
    with mean C_r, adding at most ``C_r(1 − C_r)/M ≤ 1/(4M)``. The R repetitions are
    independent, so the mean over them has ``SE ≤ sqrt((Var C_r + 1/(4M))/R)``; it must lie
    within 3·SE of k/(n + 1) (hence ≥ 1 − α − 3·SE; a correct method fails with probability
    ≤ 0.27 %, fixed seeds make the run deterministic). ``ens`` is a tiny, collapsed ensemble:
    conformal calibration must cover even for a bad predictor.
    """
    n, m_test, r_reps, alpha = 100, 200, 100 if base == "blr" else 40, 0.1
    inst = get_task("sinusoid").instance(1, 0)
    reps = np.arange(r_reps)
    y = inst.targets(reps)
    x_all, y_all = inst.calibration(reps, n + m_test)  # split: first n calibrate, the rest test
    res = get_method(base).train_predict(inst, y, reps, TINY_TRAIN, x_cal=x_all)
    k = int(np.ceil((n + 1) * (1 - alpha)))
    expected = k / (n + 1)
    var_c = k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2))
    se = np.sqrt((var_c + 1 / (4 * m_test)) / r_reps)
    for score in SCORES.names():
        low, high, q = calibrate(SCORES[score], y_all[:, :n], res.cal_prediction[:, :n], res.cal_uncertainty[:, :n],
                                 res.cal_prediction[:, n:], res.cal_uncertainty[:, n:], alpha)
        assert np.all(np.isfinite(q))
        f = np.stack([inst.truth(x[n:]) for x in x_all])
        c = conditional_coverage(low, high, f, inst.sigma).mean(axis=1)  # (R,)
        assert c.mean() >= 1 - alpha - 3 * se, (score, c.mean(), se)
        assert abs(c.mean() - expected) <= 3 * se, (score, c.mean(), expected, se)


# --- configuration, seeding, study variables, CLI -----------------------------------------------

def test_conformal_method_names_and_errors():
    m = get_method("ens+cp_std")
    assert isinstance(m, ConformalMethod) and m.trains_as == "ens" and m.ensemble and m.head == "deterministic"
    assert get_method("blr+cp_abs").closed_form is not None
    assert len(conformal_method_names()) == len(list_methods()) * len(SCORES)
    assert not any("+" in name for name in list_methods())  # "all methods" stays the seven
    with pytest.raises(ValueError, match=r"unknown method 'ens\+cp_nope'.*score of cp_abs, cp_std"):
        get_method("ens+cp_nope")
    with pytest.raises(ValueError, match=r"unknown method 'nope\+cp_abs'"):
        get_method("nope+cp_abs")
    with pytest.raises(ValueError, match="n_cal must be >= 1 for the conformal methods ens\\+cp_abs, got 0"):
        StudyConfig(methods=("ens+cp_abs",), n_cal=0).resolved()
    with pytest.raises(ValueError, match="n_cal must be an integer >= 0, got -1"):
        StudyConfig(methods=("blr",), n_cal=-1).resolved()
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\), got 1.5"):
        StudyConfig(methods=("blr",), alpha=1.5).resolved()
    StudyConfig(methods=("blr",), n_cal=0).resolved()  # no conformal method: no calibration needed


def test_too_few_calibration_points_for_alpha_refused_before_any_training(tmp_path, capsys):
    """Below ``min_calibration_size(alpha)`` (19 at 0.05, 9 at 0.1) every conformal interval is
    infinite, which no summary can score: the study is refused up front, naming --n-cal and the
    minimum (before, it trained everything and then failed in the coverage summary on
    ``ds['uncertainty'] contains non-finite values``)."""
    for methods in (("ens+cp_abs",), ("blr", "ens+cqr")):
        with pytest.raises(ValueError, match=r"n_cal must be >= 19 for the conformal methods .* at alpha 0.05 "
                                             r".*, got 18$"):
            StudyConfig(methods=methods, n_cal=18).resolved()
    StudyConfig(methods=("ens+cp_abs",), n_cal=19).resolved()
    StudyConfig(methods=("ens+cp_abs",), n_cal=9, alpha=0.1).resolved()
    StudyConfig(methods=("blr", "ens+qr"), n_cal=5).resolved()  # no conformal method
    out = tmp_path / "few"
    assert cli.main(["study", "--task", "sinusoid", "--complexities", "1", "--methods", "blr,ens+cp_abs",
                     "--repetitions", "1", "--members", "2", "--epochs", "2", "--n-cal", "5", "--out", str(out),
                     "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("uqreg study: error: --n-cal must be >= 19") and err.endswith("got 5")
    assert not out.exists()


def test_calibration_points_are_seeded_per_repetition():
    """Repetition r's calibration points come from its own stream: the same alone or in a batch,
    distinct across repetitions; inputs in the training box, noise of std σ around the truth."""
    inst = get_task("sinusoid").instance(2, 3)
    x, y = inst.calibration([0, 1, 2, 3], 500)
    x2, y2 = inst.calibration([2], 500)
    np.testing.assert_array_equal(x[2], x2[0])
    np.testing.assert_array_equal(y[2], y2[0])
    assert not np.array_equal(x[0], x[1])
    assert x.shape == (4, 500, 1) and np.all((x >= -4) & (x <= 4))
    resid = y - np.stack([inst.truth(xi) for xi in x])
    # resid = σ·ε, ε iid N(0, 1), homoscedastic task: the sample std of m = 2000 normal draws has
    # relative SE 1/sqrt(2(m − 1)) ≈ 1/sqrt(2m) = 0.0158 (bias ~1/(2m), negligible); 4 SE
    assert abs(resid.std() / inst.sigma - 1) < 4 / np.sqrt(2 * resid.size)
    with pytest.raises(ValueError, match="n_cal must be an integer >= 1, got 0"):
        inst.calibration([0], 0)


def test_conformal_results_do_not_depend_on_batching():
    """A slice of repetitions (as a sweep cell runs) gives the full study's numbers, and a
    conformal method's predictions are its base's (trained once in the study)."""
    kw = {"task": "sinusoid", "complexities": (1,), "methods": ("ens", "ens+cp_abs", "bd+cp_std", "blr+cp_std"),
          "n_cal": 15, "alpha": 0.2, "train": TINY_TRAIN}
    full = run_raw(StudyConfig(repetitions=3, **kw), progress=False)
    part = run_raw(StudyConfig(repetitions=1, first_repetition=2, **kw), progress=False)
    for v in ("interval_low", "interval_high", "conformal_quantile"):
        np.testing.assert_array_equal(full[v].sel(repetition=[2]).values, part[v].values)
    np.testing.assert_array_equal(full.prediction.sel({"method": "ens"}), full.prediction.sel({"method": "ens+cp_abs"}))
    assert np.isnan(full.conformal_quantile.sel({"method": "ens"})).all()
    assert np.isfinite(full.conformal_quantile.sel({"method": "ens+cp_abs"})).all()
    assert full.attrs["n_cal"] == 15 and full.attrs["alpha"] == 0.2


def test_study_result_variables(tmp_path):
    cfg = StudyConfig(task="styblinski_tang", complexities=(1,), methods=("blr", "ens+cp_std"), repetitions=2,
                      n_cal=30, train=TINY_TRAIN)
    ds = run_study(cfg, progress=False)
    for v, dims in {"conditional_coverage": ("recipe", "method", "complexity", "repetition", "point"),
                    "reference_conditional_coverage": ("complexity", "repetition", "point"),
                    "width_ratio": ("recipe", "method", "complexity", "repetition", "point"),
                    "reference_interval_width": ("complexity", "point"),
                    "region_conditional_coverage": ("recipe", "method", "complexity", "repetition", "region")}.items():
        assert ds[v].dims == dims
    z = ndtri(0.975)
    np.testing.assert_allclose(ds.reference_interval_width.values,
                               2 * z * np.sqrt(ds.reference_uncertainty.values ** 2 + ds.attrs["sigma"] ** 2))
    low, high = gaussian_interval(ds.prediction.sel({"method": "blr"}).values, ds.uncertainty.sel({"method": "blr"}).values,
                                  ds.attrs["sigma"], 0.05)
    np.testing.assert_allclose(ds.interval_low.sel({"method": "blr"}).values, low)
    np.testing.assert_allclose(ds.interval_high.sel({"method": "blr"}).values, high)
    assert StudyConfig.from_dict(cfg.to_dict()) == cfg


def test_cli_study_with_conformal_methods(tmp_path, capsys):
    out = tmp_path / "study"
    args = ["study", "--task", "sinusoid", "--complexities", "1,2", "--methods", "blr,ens+cp_abs,bd+cp_std",
            "--repetitions", "2", "--members", "2", "--epochs", "2", "--mc-samples", "3", "--n-cal", "20",
            "--alpha", "0.1", "--out", str(out), "--quiet"]
    assert cli.main(args) == 0
    ds = xr.open_dataset(out / "study.nc")
    assert list(ds.method.values) == ["blr", "ens+cp_abs", "bd+cp_std"]
    assert ds.attrs["n_cal"] == 20 and ds.attrs["alpha"] == 0.1
    assert "conditional_coverage" in ds and "region_reference_conditional_coverage" in ds
    pngs = {p.name for p in (out / "plots").iterdir()}
    assert {"conditional_coverage_c1.png", "conditional_coverage_c2.png", "conditional_vs_complexity.png"} <= pngs
    ds.close()
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "conditional_vs_complexity.png").exists()
    assert cli.main([*args[:-3], "--n-cal", "0", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "--n-cal must be >= 1 for the conformal methods" in capsys.readouterr().err


def test_sweep_cells_of_conformal_methods_equal_the_study(tmp_path):
    """A sweep cell holds one conformal method and trains its base itself; the combined cells
    give the study's intervals and conditional coverage exactly (float64)."""
    import uqmetrics

    from uqreg.study import summarize
    from uqreg.sweep import combine_cells, plan_cells, run_cell

    cfg = StudyConfig(task="sinusoid", complexities=(1,), methods=("blr", "ens+cp_abs", "bd+cp_std"), repetitions=3,
                      n_cal=20, train=TINY_TRAIN)
    paths = []
    for cell in plan_cells(cfg, chunk_repetitions=2):
        paths.append(uqmetrics.write_dataset(run_cell(**cell.params), tmp_path / f"{cell.key}.nc"))
    swept = summarize(combine_cells(paths, cfg))
    study = run_study(cfg, progress=False)
    for v in ("interval_low", "interval_high", "conformal_quantile", "conditional_coverage",
              "reference_conditional_coverage", "region_conditional_coverage"):
        np.testing.assert_array_equal(swept[v].values, study[v].transpose(*swept[v].dims).values)
