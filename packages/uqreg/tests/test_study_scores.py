"""The user's view of a study (docs/conventions.md#r-8): every method's Gaussian predictive and
the exact reference's scored against new noisy targets with the registered uqmetrics metrics.

Closed-form methods only (``blr``, its split-conformal version): no network is trained, so the
whole file runs in seconds.
"""

import math

import numpy as np
import pytest
import uqmetrics
import xarray as xr
from uqmetrics.metrics import regression as reg

from uqreg.reference import reference_decomposition
from uqreg.study import SCORE_METRICS, StudyConfig, run_raw, run_study, score_diagnostics, summarize
from uqreg.tasks import TASKS

HET_TASK = min(name for name, task in TASKS.items() if task.heteroscedastic)
REPS = 3
#: The uqmetrics function of each score, applied by hand.
BY_HAND = {"mace": reg.mean_absolute_calibration_error, "rmsce": reg.root_mean_squared_calibration_error,
           "miscalibration_area": reg.miscalibration_area_error, "sharpness": reg.sharpness,
           "nll": reg.gaussian_nll_loss, "crps": reg.crps_gaussian_loss, "check_score": reg.check_score_loss,
           "interval_score": reg.interval_score_loss}


def _config(task):
    return StudyConfig(task=task, complexities=(1,), methods=("blr", "blr+cp_abs"), repetitions=REPS, seed=3,
                       n_cal=100)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """task -> its study, written and read back (each run once, on first use)."""
    made = {}

    def get(task):
        if task not in made:
            ds = run_study(_config(task), progress=False)
            path = uqmetrics.write_dataset(ds, tmp_path_factory.mktemp("scores") / "study.nc")
            with xr.open_dataset(path) as f:
                made[task] = f.load()
        return made[task]

    return get


@pytest.fixture(params=["sinusoid", HET_TASK])
def study(request, studies):
    return request.param, studies(request.param)


@pytest.fixture
def sinusoid(studies):
    """The homoscedastic study, whose test points lie where the posterior-mean error is small
    next to sigma."""
    return studies("sinusoid")


def test_every_metric_has_a_method_and_a_reference_variable(study):
    _, ds = study
    assert set(BY_HAND) == set(SCORE_METRICS)
    for k in SCORE_METRICS:
        assert ds[f"score_{k}"].dims == ("recipe", "method", "complexity", "repetition")
        assert ds[f"reference_score_{k}"].dims == ("complexity", "repetition")
        for v in (f"score_{k}", f"reference_score_{k}"):
            assert np.isfinite(ds[v].values).all()
            np.testing.assert_allclose(ds[f"{v}_mean"], ds[v].mean("repetition"))
            np.testing.assert_allclose(ds[f"{v}_se"], ds[v].std("repetition", ddof=1) / math.sqrt(REPS))
    assert ds.y_test.dims == ("complexity", "repetition", "point")
    assert "R.8" in ds.attrs["score_convention"]


def test_reference_scores_are_uqmetrics_on_the_exact_predictive_and_the_same_draws(study):
    task, ds = study
    cfg = _config(task).resolved()
    inst = cfg.instance(1)
    reps = cfg.repetition_index
    y = inst.test_targets(reps)
    np.testing.assert_array_equal(ds.y_test.sel(complexity=1).values, y)
    dec = reference_decomposition(inst, inst.targets(reps))
    std = np.sqrt(dec.epistemic_variance + dec.aleatoric_variance)
    for k, fn in BY_HAND.items():
        want = [fn(y[r], dec.mean[r], std) for r in range(len(reps))]
        np.testing.assert_allclose(ds[f"reference_score_{k}"].sel(complexity=1).values, want, rtol=1e-9,
                                   err_msg=k)
        # blr IS the exact posterior predictive: its scores are the reference's (std recovered from its
        # interval's half-width, to rounding)
        np.testing.assert_allclose(ds[f"score_{k}"].sel({"method": "blr", "complexity": 1}).isel(recipe=0).values,
                                   want, rtol=1e-6, atol=1e-9, err_msg=k)


def test_reference_mace_is_within_the_dkw_bound(sinusoid):
    """For the exact predictive, (y - mean)/std is standard normal at every test point, so the
    observed proportion inside each central interval deviates from its level by at most
    2·sup|F_n - F| over the n test points: DKW, P(sup > eps) <= 2 exp(-2 n eps²), at failure
    probability 1e-6 per repetition. The points share the posterior-mean error, so the bound
    holds only where it is small next to sigma: the sinusoid's test points. (polynomial_het's
    grid is 90 % extrapolation, epistemic variance about 3x the aleatoric: its reference MACE per
    repetition runs to 0.15, the attainable value there, and 0.02 in distribution.)"""
    ds = sinusoid
    n = ds.sizes["point"]
    eps = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    assert (ds.reference_score_mace.values < 2 * eps).all(), (ds.reference_score_mace.values, 2 * eps)
    assert (ds.reference_score_miscalibration_area.values < 2 * eps).all()


def test_a_method_with_its_std_scaled_wrong_scores_worse_than_the_reference(sinusoid):
    """blr (the exact predictive) with its std 3x or 1/3 of the exact one, on the sinusoid
    (where the bound above holds; per repetition the reference is not the conditional truth
    where extrapolation dominates, as on polynomial_het's grid)."""
    ds = sinusoid
    raw = ds[["prediction", "interval_low", "interval_high", "y_test", "truth", "x_test", "x_train", "y_train",
              "n_train", "input_size", "in_distribution"]]
    raw.attrs = dict(ds.attrs)
    half = (raw.interval_high - raw.interval_low) / 2
    for factor in (3.0, 1 / 3):
        wrong = raw.assign(interval_low=raw.prediction - factor * half, interval_high=raw.prediction + factor * half)
        s = score_diagnostics(wrong).sel({"method": "blr"})
        for k in ("mace", "rmsce", "nll", "crps", "interval_score"):
            assert (s[f"score_{k}"] > s[f"reference_score_{k}"] + 1e-3).all(), (k, factor)
        assert (s.score_mace > 0.1).all()


def test_a_file_without_new_targets_gets_no_scores_and_old_numbers_stay():
    """Files written before R.8 hold no ``y_test``: summarize adds no scores, and everything else
    is the same as with it."""
    raw = run_raw(_config("sinusoid"), progress=False)
    new, old = summarize(raw), summarize(raw.drop_vars("y_test"))
    assert not [v for v in old.data_vars if "score" in v]
    xr.testing.assert_equal(new[list(old.data_vars)], old)  # identical but for the attributes
