"""The training recipes' L2 conventions against closed forms, and the collapse flag (R.3b).

With no hidden layers (``TrainConfig(hidden=())``) the network is ``x·w + b``, linear in its
parameters, and full-batch Adam (float64) converges to a fixed point of its update:

* ``paper`` (coupled, λ = 1/N): the gradient of ½·mean (y − Xw − b)² plus λw vanishes, so
  ``(XcᵀXc/N + λI) w = Xcᵀyc/N`` and ``b = ȳ − x̄ᵀw`` (Xc, yc centred: the bias is unpenalised),
  the same as ``(XᵀX/N + λI_w) [w; b] = Xᵀy/N`` with the bias column unpenalised;
* ``sum``: the same with λ/N;
* ``none``: λ = 0, least squares;
* ``decoupled`` (AdamW): ``w ← w(1 − lr·λ) − lr·m̂/(√v̂ + ε)``; at a fixed point m̂ = g and
  v̂ = g², so ``g/(|g| + ε) = −λw``, i.e. ``|g| = ελ|w|/(1 − λ|w|)`` ≈ 1e-10: least squares
  again. Full-batch AdamW's decay does not regularise at convergence (it only slows the way
  there). Adam with a constant learning rate ends in a small limit cycle around this point,
  1.2e-4 wide here (measured with a plain numpy AdamW, 1e4–1e5 steps).

Tolerances: the coupled recipes converge to within 3e-6 in 3,000 epochs (measured); they are
compared at 1e-4, far below the distance between the recipes' solutions (asserted > 2e-3, so
a wrong λ convention cannot pass). The decoupled one is compared at 1e-3 against a distance of
more than 0.1 to the paper's solution.
"""

from __future__ import annotations

import numpy as np
import pytest

from uqreg.diagnostics import COLLAPSE_THRESHOLD, collapsed, constant_loss, half_mse
from uqreg.engine import RECIPES, NetworkBatch, TrainConfig, train_batched
from uqreg.methods import MethodResult

N, D = 40, 3
COUPLED_TOL = 1e-4


@pytest.fixture(scope="module")
def data():
    g = np.random.default_rng(0)
    x = g.uniform(-2, 2, (N, D)) * np.array([1.0, 0.5, 2.0]) + np.array([0.5, -1.0, 0.0])
    f = x @ np.array([1.0, -2.0, 0.5]) + 0.3
    y = np.stack([f + 0.5 * g.standard_normal(N) for _ in range(2)])  # two repetitions
    return x, f, y


def ridge(x, y, lam):
    """The closed form: weights (d,) and bias of ½·mean (y − xw − b)² + ½λ‖w‖²."""
    xm, ym = x.mean(axis=0), y.mean()
    xc, yc = x - xm, y - ym
    w = np.linalg.solve(xc.T @ xc / len(y) + lam * np.eye(x.shape[1]), xc.T @ yc / len(y))
    return np.append(w, ym - xm @ w)


FIXED_POINT_LAMBDA = {"paper": 1.0 / N, "sum": 1.0 / N**2, "none": 0.0, "decoupled": 0.0}


def _train(x, y, recipe: str, epochs: int, backend: str) -> np.ndarray:
    """The trained [w; b] of both repetitions, shape (2, d + 1)."""
    cfg = TrainConfig(hidden=(), dtype="float64", recipe=recipe, backend=backend)
    model = train_batched(x, y, NetworkBatch(np.array([0, 1]), np.array([0, 0])), seed=0, head="deterministic",
                          sampler="full", adversarial=False, cfg=cfg, epochs=epochs, sigma=0.5)
    w = model.weights[0].detach().numpy()[:, :, 0]
    b = model.biases[0].detach().numpy()[:, 0, :]
    return np.hstack([w, b])


def test_recipe_table_is_the_protocol():
    """R.3b: the four recipes and the factor each applies to the weights for N = 40."""
    assert RECIPES.names()[:4] == ["paper", "sum", "decoupled", "none"]
    assert RECIPES.lookup("paper").weight_decay(N) == 1 / N and not RECIPES.lookup("paper").decoupled
    assert RECIPES.lookup("sum").weight_decay(N) == 1 / N**2
    assert RECIPES.lookup("decoupled").weight_decay(N) == 1 / N and RECIPES.lookup("decoupled").decoupled
    assert RECIPES.lookup("none").weight_decay(N) == 0.0
    assert RECIPES.lookup("paper").weight_decay(N, 0.3) == 0.3  # TrainConfig.weight_decay overrides λ
    with pytest.raises(ValueError, match="l2_mode must be one of coupled, sum, decoupled, none"):
        type(RECIPES.lookup("paper"))("x", "bad", "mean")


@pytest.mark.parametrize("backend", ["fused", pytest.param("autograd", marks=pytest.mark.slow)])
@pytest.mark.parametrize("recipe", ["paper", "sum", "none"])
def test_coupled_recipes_converge_to_their_ridge_solution(data, recipe, backend):
    x, _, y = data
    trained = _train(x, y, recipe, 3000, backend)
    for r in range(2):
        expected = ridge(x, y[r], FIXED_POINT_LAMBDA[recipe])
        np.testing.assert_allclose(trained[r], expected, rtol=0, atol=COUPLED_TOL, err_msg=f"{recipe} rep {r}")
        for other, lam in FIXED_POINT_LAMBDA.items():  # the test tells the conventions apart
            if lam != FIXED_POINT_LAMBDA[recipe]:
                assert np.abs(ridge(x, y[r], lam) - expected).max() > 20 * COUPLED_TOL, (recipe, other)


def test_decoupled_recipe_converges_to_least_squares(data):
    x, _, y = data
    trained = _train(x, y, "decoupled", 12000, "fused")
    for r in range(2):
        ols = ridge(x, y[r], 0.0)
        np.testing.assert_allclose(trained[r], ols, rtol=0, atol=1e-3)
        assert np.abs(ridge(x, y[r], 1.0 / N) - ols).max() > 0.1  # far from the coupled solution


# ---------------------------------------------------------------------------------------------
# the collapse flag


def test_constant_network_is_collapsed_and_a_fit_is_not(data):
    """A network predicting the mean of its targets is collapsed (its loss IS the best
    constant's); one predicting the noise-free truth is not (its loss is ½σ² ≈ 0.125 against
    ½·var y ≈ 1.6 here); a network halfway is not either."""
    _, f, y = data
    const = np.broadcast_to(y.mean(axis=1, keepdims=True), y.shape)
    np.testing.assert_allclose(half_mse(const, y), constant_loss(y), rtol=1e-12)
    assert np.all(collapsed(half_mse(const, y), constant_loss(y)))
    truth = np.broadcast_to(f, y.shape)
    assert not np.any(collapsed(half_mse(truth, y), constant_loss(y)))
    halfway = 0.5 * (const + truth)
    assert not np.any(collapsed(half_mse(halfway, y), constant_loss(y)))
    # the per-network flag as Method.run computes it: fits (R, M, N), members averaged
    fits = np.stack([const, truth, truth], axis=1)  # member 0 constant, members 1-2 fit
    res = MethodResult.from_networks(np.zeros((2, 5)), np.zeros((2, 5)), fits, y)
    np.testing.assert_allclose(res.collapsed_fraction, [1 / 3, 1 / 3])
    np.testing.assert_allclose(res.train_loss, half_mse(fits, y[:, None, :]).mean(axis=1))
    assert COLLAPSE_THRESHOLD == 0.95


def test_trained_linear_network_is_not_collapsed(data):
    """A linear network trained without L2 on a linear task fits the truth: not collapsed."""
    x, _, y = data
    w = _train(x, y, "none", 3000, "fused")
    fit = x @ w[:, :D].T + w[:, D]
    loss = half_mse(fit.T, y)
    assert not np.any(collapsed(loss, constant_loss(y)))
    assert np.all(loss < 0.2 * constant_loss(y))


@pytest.mark.parametrize("module", ["uqreg.diagnostics", "uqreg.engine.config"])
def test_doctests(module):
    """The Examples of the recipes and the collapse diagnostics run (and some were attempted)."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0, result
