"""Quantile networks and conformalized quantile regression (docs/conventions.md#r-6).

* the pinball objective and its hand-written gradient against a hand computation and autograd;
  the fused step against the autograd backend (gradients, trained networks), and a quantile
  network's bits independent of its chunk;
* the registry: ``<method>+qr`` / ``<method>+cqr`` for the ensembles and Bernoulli dropout only,
  n_cal = 0 refused;
* the marginal coverage of CQR over noise draws against its exact Beta law;
* a study's exact conditional coverage of the CQR interval on a heteroscedastic and a
  homoscedastic task, against a hand computation from the bounds, and the other methods'
  variables unchanged by listing quantile methods beside them;
* the conformal step against MAPIE's ConformalizedQuantileRegressor on the same quantiles.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.special import ndtri
from scipy.stats import norm
from two_output_check import assert_fused_gradients_equal_autograd

from uqreg import rng
from uqreg.conformal import conditional_coverage, cqr_calibrate, cqr_scores
from uqreg.engine import BatchedMLP, NetworkBatch, TrainConfig
from uqreg.engine.objectives import OBJECTIVES, pinball_pair, pinball_pair_grad
from uqreg.engine.train import train_batched
from uqreg.methods import (
    CQRMethod,
    QuantileMethod,
    get_method,
    quantile_bases,
    quantile_method_names,
)
from uqreg.study import StudyConfig, run_raw, run_study
from uqreg.tasks import get_task

SEED = 5
N_TRAIN = 9
ALPHA = 0.1


def _bonferroni_k(m: int, family_error: float = 2.7e-3) -> float:
    """Two-sided normal quantile k with P(any of m independent |Z| > k) <= family_error."""
    return float(ndtri(1 - family_error / (2 * m)))


# --- the objective -------------------------------------------------------------------------------

def test_pinball_loss_and_gradient_by_hand():
    """α = 0.2: levels 0.1 and 0.9. ρ_τ(r) = r(τ − 1[r < 0]), r = y − q.
    q_lo = (0.5, 0.5, 2) for y = (1, 0, 2): 0.1·0.5, 0.9·0.5, 0; q_hi = (1.5, −1, 3): 0.1·0.5,
    0.9·1, 0.1·1; mean over the 3 rows of the sum = 1.55/3. dJ/dq = (1[y < q] − τ)/3, at
    y = q the derivative from below in q, −τ/3."""
    y = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    lo = torch.tensor([[0.5, 0.5, 2.0]], dtype=torch.float64, requires_grad=True)
    hi = torch.tensor([[1.5, -1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    cfg = TrainConfig()
    loss = pinball_pair(lo, hi, y, cfg, alpha=0.2)
    assert loss.shape == (1,) and abs(float(loss.detach()) - 1.55 / 3) < 1e-15
    g_lo, g_hi = pinball_pair_grad(lo.detach(), hi.detach(), y, cfg, alpha=0.2)
    np.testing.assert_allclose(g_lo.numpy(), [[-0.1 / 3, 0.9 / 3, -0.1 / 3]], rtol=1e-15)
    np.testing.assert_allclose(g_hi.numpy(), [[0.1 / 3, -0.9 / 3, 0.1 / 3]], rtol=1e-15)
    a_lo, a_hi = torch.autograd.grad(loss.sum(), (lo, hi))
    assert torch.equal(a_lo, g_lo) and torch.equal(a_hi, g_hi)
    obj = OBJECTIVES["pinball"]
    assert obj.outputs == 2 and obj.uses_alpha
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\) for the objective 'pinball', got None"):
        obj.bound(None)


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"dtype": "float64", "hidden": (6, 5, 4), "members": 3, "mc_samples": 4, **kw})


def _model(head: str, d: int, cfg: TrainConfig, b: int = 3) -> BatchedMLP:
    keys = rng.network_keys(SEED, "init", np.arange(b), np.zeros(b, dtype=np.int64))
    drop = rng.network_keys(SEED, "dropout", np.arange(b), np.zeros(b, dtype=np.int64))
    model = BatchedMLP(keys, drop, d, head, cfg, N_TRAIN, 0.7, "pinball", ALPHA)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


@pytest.mark.parametrize("fgsm", [False, True], ids=["plain", "fgsm"])
@pytest.mark.parametrize("head", ["deterministic", "bernoulli"])
def test_fused_gradients_equal_autograd(head, fgsm):
    """Every parameter's gradient of a quantile network (both output layers; the upper one's
    weight under the coupled L2 like every weight), with and without FGSM."""
    cfg = _cfg(recipe="paper")
    model = _model(head, 2, cfg)
    assert_fused_gradients_equal_autograd(model, cfg, N_TRAIN, fgsm, head)


@pytest.fixture(scope="module")
def instance():
    return get_task("sinusoid_het").instance(1, SEED, n_train=12)


def _train(method, instance, nets, cfg, epochs=6):
    cfg = replace(cfg, **method.overrides)
    y = instance.targets(range(int(nets.repetition.max()) + 1))
    return train_batched(instance.x_train, y, nets, seed=instance.seed, head=method.head, sampler=method.sampler,
                         adversarial=method.adversarial, cfg=cfg, epochs=epochs, sigma=instance.sigma,
                         objective=method.objective, alpha=ALPHA)


@pytest.mark.parametrize("name", ["ens+qr", "ens_adv+qr", "ens_bs+qr", "bd+qr"])
def test_backends_train_the_same_networks(name, instance):
    method = get_method(name)
    cfg = _cfg(recipe="paper")
    nets = method.networks([0, 2], cfg)
    fused = _train(method, instance, nets, replace(cfg, backend="fused"))
    autograd = _train(method, instance, nets, replace(cfg, backend="autograd"))
    for i in range(len(nets)):
        for a, e in zip(fused.network_parameters(i), autograd.network_parameters(i), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9 * float(e.abs().max()))


@pytest.mark.parametrize("name", ["ens_adv+qr", "bd+qr"])
def test_network_bitwise_independent_of_its_chunk(name, instance):
    """float32: a quantile network trains to the same bits alone, first in a chunk of 2, or
    inside a chunk of 40."""
    method = get_method(name)
    cfg = TrainConfig(hidden=(16, 12, 8), members=3)
    big = NetworkBatch(np.repeat(np.arange(10), 4), np.tile(np.arange(4), 10))
    alone = NetworkBatch(np.array([0]), np.array([2]))
    first = NetworkBatch(np.array([0, 9]), np.array([2, 3]))
    m_big, m_alone, m_first = (_train(method, instance, nets, cfg, epochs=15) for nets in (big, alone, first))
    for a, b, c in zip(m_big.network_parameters(2), m_alone.network_parameters(0), m_first.network_parameters(0),
                       strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), name


# --- the registry ----------------------------------------------------------------------------------

def test_quantile_and_cqr_names_and_errors():
    assert quantile_bases() == ["bd", "ens", "ens_adv", "ens_bs"]
    assert quantile_method_names() == [f"{b}+{s}" for b in quantile_bases() for s in ("qr", "cqr")]
    qr, cqr = get_method("ens_adv+qr"), get_method("ens_adv+cqr")
    assert isinstance(qr, QuantileMethod) and not isinstance(qr, CQRMethod) and qr.trains_as == "ens_adv+qr"
    assert isinstance(cqr, CQRMethod) and cqr.trains_as == "ens_adv+qr"
    assert qr.objective == cqr.objective == "pinball" and qr.adversarial and qr.ensemble
    assert get_method("bd+cqr").head == "bernoulli" and not get_method("bd+cqr").ensemble
    with pytest.raises(ValueError, match=r"'cd\+qr': 'cd' has no quantile version \(those of bd, ens, ens_adv, "
                                         r"ens_bs: 'cd' regularises against the Gaussian likelihood"):
        get_method("cd+qr")
    with pytest.raises(ValueError, match=r"'vd\+cqr': 'vd' has no quantile version"):
        get_method("vd+cqr")
    with pytest.raises(ValueError, match=r"'blr\+cqr': 'blr' has no quantile version .*trains no network"):
        get_method("blr+cqr")
    with pytest.raises(ValueError, match=r"unknown method 'ens\+qr\+cp_abs'.*<method>\+cqr"):
        get_method("ens+qr+cp_abs")
    with pytest.raises(ValueError, match="n_cal must be >= 1 for the conformal methods ens\\+cqr, got 0"):
        StudyConfig(methods=("ens+qr", "ens+cqr"), n_cal=0).resolved()
    StudyConfig(methods=("ens+qr",), n_cal=0).resolved()  # quantile regression alone needs no calibration


# --- marginal coverage ------------------------------------------------------------------------------

CASES = [("ens", "sinusoid"), ("bd", "sinusoid_het")]


@pytest.mark.parametrize("base, task", CASES)
def test_cqr_marginal_coverage(base, task):
    """CQR's coverage over noise draws, against its exact distribution (test_conformal.py's
    argument for split conformal, which holds for any continuous score).

    Per repetition r the quantile networks are retrained on a fresh noise draw, calibrated on n
    fresh calibration points, and evaluated at M fresh inputs drawn like the training inputs,
    by the exact ``c_r = mean_x P(y ∈ I_r(x) | x)`` (σ(x) at each x on the heteroscedastic
    task). With ``k = ⌈(n + 1)(1 − α)⌉ ≤ n``, ``C_r = P(y ∈ I_r | training, calibration)`` is
    Beta(k, n + 1 − k): mean ``k/(n + 1)``, variance ``k(n + 1 − k)/((n + 1)²(n + 2))``; given
    C_r, c_r averages M values in [0, 1] with mean C_r, adding at most ``1/(4M)``. The mean over
    the R independent repetitions has ``SE ≤ sqrt((Var C_r + 1/(4M))/R)`` and must lie within
    k_B·SE of k/(n + 1), k_B the Bonferroni bound for the two cases at a family error of 0.27 %
    (3.2, from the count, not tuned). The tiny, briefly trained networks are a bad quantile
    predictor: conformal calibration must cover anyway."""
    n, m_test, r_reps = 100, 200, 40
    inst = get_task(task).instance(1, 0)
    reps = np.arange(r_reps)
    y = inst.targets(reps)
    x_all, y_all = inst.calibration(reps, n + m_test)  # split: first n calibrate, the rest test
    cfg = TrainConfig(members=2, epochs=3, mc_samples=4, hidden=(16, 8), dtype="float64")
    res = get_method(f"{base}+qr").train_predict(inst, y, reps, cfg, x_cal=x_all, alpha=ALPHA)
    lo, hi = res.cal_quantile_low, res.cal_quantile_high
    low, high, q = cqr_calibrate(y_all[:, :n], lo[:, :n], hi[:, :n], lo[:, n:], hi[:, n:], ALPHA)
    assert np.all(np.isfinite(q))
    f = np.stack([inst.truth(x[n:]) for x in x_all])
    sigma = np.stack([inst.noise_std(x[n:]) for x in x_all])
    assert (task == "sinusoid_het") == (np.ptp(sigma) > 0)
    c = conditional_coverage(low, high, f, sigma).mean(axis=1)  # (R,)
    k = int(np.ceil((n + 1) * (1 - ALPHA)))
    expected = k / (n + 1)
    se = np.sqrt((k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2)) + 1 / (4 * m_test)) / r_reps)
    assert abs(c.mean() - expected) <= _bonferroni_k(len(CASES)) * se, (c.mean(), expected, se)


# --- a study: exact conditional coverage, the other methods unchanged --------------------------------

TINY = TrainConfig(hidden=(8,), members=2, epochs=3, mc_samples=4, dtype="float64")


@pytest.mark.parametrize("task", ["sinusoid_het", "sinusoid"])
def test_study_cqr_conditional_coverage_by_hand(task):
    """The study's R.6 variables of ``ens+cqr``: the interval is ``ens+qr``'s widened by the
    conformal quantile q, q is the ⌈(n_cal + 1)(1 − α)⌉-th smallest score recomputed by hand,
    and the exact conditional coverage is ``Φ((u − f)/σ(x)) − Φ((l − f)/σ(x))`` with the task's
    σ(x) (scipy's normal cdf). The base methods' variables are those of a study without the
    quantile methods, bit for bit."""
    n_cal, reps = 20, 2
    cfg = StudyConfig(task=task, complexities=(1,), repetitions=reps, methods=("blr", "ens", "ens+qr", "ens+cqr"),
                      n_cal=n_cal, alpha=ALPHA, n_train=20, train=TINY)
    ds = run_study(cfg, progress=False).isel(recipe=0, complexity=0)
    qr, cqr = (ds.isel(method=list(ds.method.values).index(m)) for m in ("ens+qr", "ens+cqr"))
    q = cqr.conformal_quantile.values
    assert np.all(np.isfinite(q)) and np.all(np.isnan(qr.conformal_quantile.values))
    assert np.array_equal(cqr.interval_low.values, qr.interval_low.values - q[:, None])
    assert np.array_equal(cqr.interval_high.values, qr.interval_high.values + q[:, None])
    assert np.array_equal(cqr.prediction.values, qr.prediction.values)
    np.testing.assert_allclose(cqr.uncertainty.values, (cqr.interval_high - cqr.interval_low).values
                               / (2 * ndtri(1 - ALPHA / 2)), rtol=1e-15)
    # q by hand from the quantiles at the calibration points
    inst = cfg.instance(1)
    calibration = inst.calibration(np.arange(reps), n_cal)
    res = get_method("ens+qr").run(inst, inst.targets(np.arange(reps)), np.arange(reps), TINY,
                                   calibration=calibration, alpha=ALPHA)
    np.testing.assert_array_equal(res.interval_low, qr.interval_low.values)
    k = int(np.ceil((n_cal + 1) * (1 - ALPHA)))
    scores = np.maximum(res.cal_quantile_low - calibration[1], calibration[1] - res.cal_quantile_high)
    np.testing.assert_array_equal(np.sort(scores, axis=1)[:, k - 1], q)
    # the exact conditional coverage from the bounds
    sigma = inst.noise_std(inst.x_test)
    assert (task == "sinusoid_het") == (np.ptp(sigma) > 0)
    f = inst.truth(inst.x_test)
    u, low = cqr.interval_high.values, cqr.interval_low.values
    np.testing.assert_allclose(cqr.conditional_coverage.values,
                               norm.cdf((u - f) / sigma) - norm.cdf((low - f) / sigma), rtol=0, atol=1e-15)
    np.testing.assert_allclose(cqr.width_ratio.values, (u - low) / ds.reference_interval_width.values, rtol=1e-15)
    for m in (qr, cqr):  # the user's-view scores (R.8) come out
        assert np.all(np.isfinite(m.score_crps.values)) and np.all(np.isfinite(m.score_mace.values))
    # the base methods unchanged by the quantile methods beside them
    alone = run_raw(replace(cfg, methods=("blr", "ens")), progress=False)
    both = ds.isel(method=[0, 1])  # blr, ens
    for v in ("prediction", "uncertainty", "interval_low", "interval_high", "train_loss", "collapsed_fraction"):
        assert np.array_equal(alone[v].isel(recipe=0, complexity=0).values, both[v].values, equal_nan=True), v


# --- MAPIE ---------------------------------------------------------------------------------------------

def _lookup(table):
    """A prefit scikit-learn regressor that returns ``table[i]`` for the row index ``i = X[:, 0]``:
    MAPIE then conformalizes exactly the arrays it is given."""
    from sklearn.base import BaseEstimator, RegressorMixin

    class Lookup(RegressorMixin, BaseEstimator):
        def __init__(self, table=None):
            self.table = table

        def fit(self, X, y=None):
            self.table_ = np.asarray(self.table, dtype=np.float64)
            self.is_fitted = True
            return self

        def predict(self, X):
            return self.table_[np.asarray(X)[:, 0].astype(int)]

    return Lookup(table).fit(None)


def _mapie(lo, hi, y, n, alpha, symmetric):
    from mapie.regression import ConformalizedQuantileRegressor

    ests = [_lookup(lo), _lookup(hi), _lookup(0.5 * (lo + hi))]
    x = np.arange(len(y), dtype=np.float64)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MAPIE's warnings about its own checks of prefit estimators
        m = ConformalizedQuantileRegressor(ests, confidence_level=1 - alpha, prefit=True)
        m.conformalize(x[:n], y[:n])
        _, bounds = m.predict_interval(x[n:], symmetric_correction=symmetric)
    return bounds[:, 0, 0], bounds[:, 1, 0]


@pytest.mark.parametrize("n, alpha", [(50, 0.1), (99, 0.05), (200, 0.3), (99, 0.45)])
def test_cqr_equals_mapie(n, alpha):
    """The conformal step against MAPIE's ConformalizedQuantileRegressor (prefit estimators
    returning our arrays) on the same quantiles and calibration targets.

    * ``symmetric_correction=True`` is Romano et al.'s CQR, one q from ``max(q_lo − y, y − q_hi)``:
      bounds equal bit for bit where the ranks agree. MAPIE's rank is
      ``ceil((1 − α)(n + 1))`` in floating point, ours rounds the product to 10 decimals first;
      they differ where the product is an integer that floating point puts above it
      (n = 99, α = 0.45: 55.00000000000001, MAPIE rank 56, ours 55): there MAPIE's q is the 56th
      smallest score and ours the 55th.
    * MAPIE's default (``symmetric_correction=False``) is the asymmetric variant (Romano et al.
      2019, §6): ``q_lo − q₁`` and ``q_hi + q₂`` with ``q₁``, ``q₂`` the ⌈(n + 1)(1 − α/2)⌉-th
      smallest of ``q_lo − y`` and of ``y − q_hi`` separately; uqreg's ``+cqr`` is the symmetric
      one."""
    pytest.importorskip("mapie")
    gen = np.random.default_rng(n)
    t = 40
    lo = gen.normal(size=n + t) - 1.0
    hi = lo + gen.uniform(0.2, 3.0, size=n + t)
    y = gen.normal(size=n + t) * gen.uniform(0.5, 2.0, size=n + t)
    low, high, q = cqr_calibrate(y[None, :n], lo[None, :n], hi[None, :n], lo[None, n:], hi[None, n:], alpha)
    scores = np.sort(cqr_scores(y[:n], lo[:n], hi[:n]))
    k_ours = int(np.ceil(np.round((n + 1) * (1 - alpha), 10)))
    k_mapie = int(np.ceil(np.array([1 - alpha]) * (n + 1))[0])
    assert q[0] == scores[k_ours - 1]
    m_low, m_high = _mapie(lo, hi, y, n, alpha, symmetric=True)
    if k_ours == k_mapie:
        assert np.array_equal(m_low, low[0]) and np.array_equal(m_high, high[0])
    else:
        assert (n, alpha, k_ours, k_mapie) == (99, 0.45, 55, 56)
        assert np.array_equal(m_low, lo[n:] - scores[k_mapie - 1])
        assert np.array_equal(m_high, hi[n:] + scores[k_mapie - 1])
    a_low, a_high = _mapie(lo, hi, y, n, alpha, symmetric=False)
    k2 = int(np.ceil(np.round((n + 1) * (1 - alpha / 2), 10)))
    q1, q2 = np.sort(lo[:n] - y[:n])[k2 - 1], np.sort(y[:n] - hi[:n])[k2 - 1]
    assert np.array_equal(a_low, lo[n:] - q1) and np.array_equal(a_high, hi[n:] + q2)


# --- the command line -----------------------------------------------------------------------------------

def test_cli_lists_and_runs_cqr(tmp_path, capsys):
    """``uqreg methods`` lists every quantile and CQR version; ``uqreg study`` runs them and
    refuses ``--n-cal 0`` for ``+cqr`` with one line and exit code 2."""
    import xarray as xr

    from uqreg import cli

    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{name} " in out for name in quantile_method_names())
    args = ["study", "--task", "sinusoid_het", "--complexities", "1", "--methods", "blr,bd+qr,bd+cqr",
            "--repetitions", "2", "--epochs", "2", "--mc-samples", "3", "--n-train", "20", "--n-cal", "20",
            "--alpha", "0.1", "--no-plots", "--out", str(tmp_path / "study"), "--quiet"]
    assert cli.main(args) == 0
    with xr.open_dataset(tmp_path / "study" / "study.nc") as ds:
        assert list(ds.method.values) == ["blr", "bd+qr", "bd+cqr"]
        assert np.isfinite(ds.conformal_quantile.values[0, 2]).all()
    assert cli.main([*args[:-3], "--n-cal", "0", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "--n-cal must be >= 1 for the conformal methods bd+cqr, got 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
