"""K-FAC Laplace (:mod:`uqvision.methods.laplace`) against laplace-torch 0.3 (Daxberger et al.
2021, "Laplace Redux -- effortless Bayesian deep learning"), the field's reference
implementation: ``KronLaplace`` with an empirical-Fisher backend (``AsdlEF`` and
``CurvlinopsEF`` compute Kronecker factors; ``BackPackEF`` raises for them), on small networks
in float64 at random weights (the factors are defined at any weights, not only at the MAP):
an MLP with and without biases and a CNN whose Conv2d has a non-square kernel, stride and
padding (Grosse & Martens' KFC factors of the unfolded patches).

Per layer, with ``N`` examples, input rows ``a`` (one per example and location; ours with a
1 appended for the bias) and gradients ``g`` of the summed cross-entropy w.r.t. the layer's
output (one per example and location), in parameter order (``W`` row-major, then ``b``):

- input factor: ours ``A`` = mean of ``a a^T`` over examples and locations, the bias its last
  row and column (``A_bb = 1``); laplace-torch's ``A`` is the same mean without the bias:
  ours restricted to the weights, ``A_ww``;
- gradient factor: ours ``G = (1/N) sum g g^T``, theirs ``B = sum g g^T`` (both over examples
  and locations): ``B = N G``;
- Fisher: ours ``N (G ⊗ A)``; theirs ``B ⊗ A`` on the weights and ``B`` alone on the bias, so
  equal on the weight block (``N G ⊗ A_ww``) and on the bias block (``N A_bb G = N G``);
  the weight-bias block, ours ``N G ⊗ A_wb``, is 0 in theirs (by design: the bias is a block
  of its own). Equal for both backends and any batching (ours in batches of 5, theirs of 7).

The prior precision ``tau`` enters by design differently. Ours: Martens & Grosse's
pi-corrected damping, ``N (A + pi sqrt(eps) I) ⊗ (G + sqrt(eps)/pi I)``, ``eps = tau / N``,
``pi = sqrt((tr A / dim A) / (tr G / dim G))`` (bias column included). Theirs: ``B ⊗ A + tau
I`` exactly (``damping=False``, the default), or ``(B + sqrt(tau) I) ⊗ (A + sqrt(tau) I)``
(``damping=True``), which is the damping above with ``pi = sqrt(N)`` in our normalisation:
it depends on how a constant is shared between the factors, ours balances them by their mean
eigenvalues. Ours is exactly theirs damped, applied to the factors rebalanced as ``(B / c,
c A)`` with ``c = sqrt(N) / pi`` (``B ⊗ A`` unchanged): the weight blocks are compared so
against laplace-torch's damped ``KronDecomposed``. The bias block, ``B + tau I`` alone in
theirs, is ours ``N (1 + pi sqrt(eps)) (G + sqrt(eps)/pi I) = (1 + pi sqrt(eps)) (B +
sqrt(tau N)/pi I)``, tested against that formula with laplace-torch's ``B``. laplace-torch 0.3
loses ``damping=True`` when ``KronLaplace`` adds the prior (``KronDecomposed.__add__`` and
``__mul__`` build their result without it), so its ``posterior_precision``, log-determinant
and ``sample`` are undamped even then; the test builds the damped ``KronDecomposed`` itself.

Ours has no undamped posterior to compare with ``damping=False`` (``B ⊗ A + tau I``). Its
samples are ``w_MAP + s N^(-1/2) L_G^-T Z L_A^-1``, covariance ``s^2`` times the inverse of
the damped precision ``P``: the scale ``s`` tuned on validation data stands where
laplace-torch tunes the prior precision (at temperature 1); on the rebalanced weight blocks
of laplace-torch's damped form, ours is temperature ``T = s^2`` with prior precision ``tau /
s^2``. Our side is tested against the formula: the draws whitened by ``P`` (built here from
our factors) have ``sum delta^T P delta / s^2 ~ chi^2`` with (draws x parameters) degrees of
freedom.

Tolerances: a factor entry is a sum over ``n`` rows whose terms' absolute sum is at most the
largest diagonal entry (Cauchy-Schwarz), so rounding grows as ``sqrt(n) eps`` times it; two
factors, two implementations (their hooks, our gradients w.r.t. the outputs) and the scaling
by ``N`` give ``8 sqrt(n) eps max|M|``. The damped precision adds our inverse Cholesky
factors, re-inverted here: ``dim kappa eps`` per factor, ``kappa`` its condition number.

The module skips where laplace-torch is not installed, except under ``CI=true``, where that is
a failure (the ``test`` extra installs it).
"""

from __future__ import annotations

import copy
import math
import os
import warnings

import pytest
import scipy.stats
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    with warnings.catch_warnings():  # asdl, imported by laplace, calls torch.jit.script
        warnings.simplefilter("ignore", FutureWarning)
        import laplace
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{exc}; CI=true: the laplace-torch reference tests must run in CI "
                    "(uqvision[test] installs laplace-torch)", pytrace=False)
    pytest.importorskip("laplace", reason="laplace-torch (uqvision[test]) is not installed")

from laplace.curvature import AsdlEF, CurvlinopsEF
from laplace.utils.matrix import Kron, KronDecomposed

from uqvision.methods import TRAINING_METHODS
from uqvision.methods.laplace import _kfac_posterior, kfac_factors

# asdl's module hooks (AsdlEF) are torch's deprecated non-full backward hooks
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")

N, TAU = 20, 0.5
EPS = torch.finfo(torch.float64).eps


def mlp(bias=True):
    return nn.Sequential(nn.Linear(5, 6, bias=bias), nn.Tanh(), nn.Linear(6, 3, bias=bias))


def cnn():
    return nn.Sequential(nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0)), nn.ReLU(),
                         nn.Flatten(), nn.Linear(3 * 3 * 5, 4))


#: name: (network, input shape, classes, rows per example of each K-FAC layer)
NETS = {"mlp": (mlp, (5,), 3, (1, 1)), "mlp_no_bias": (lambda: mlp(False), (5,), 3, (1, 1)),
        "cnn": (cnn, (2, 6, 6), 4, (15, 1))}


def problem(name, prior_precision=TAU, scales=(1.0,)):
    """A float64 network at seeded random weights, N examples, and our fitted state."""
    make, shape, classes, _ = NETS[name]
    torch.manual_seed(0)
    net = make().double()
    x = torch.randn(N, *shape, dtype=torch.float64)
    y = torch.arange(N) % classes
    method = TRAINING_METHODS.lookup("kfac_laplace")
    hp = method.hparams_from(epochs=1, prior_precision=prior_precision, scales=scales,
                             bn_update=False)
    state = method.start(net, hp, n_train=N, steps_per_epoch=1)
    return method, state, x, y


def reference(net, x, y, backend):
    """laplace-torch's Kronecker factors ``[[B, A], [B]]`` per layer (``[B, A]`` without a
    bias), fitted on a copy of ``net`` in batches of 7."""
    la = laplace.KronLaplace(copy.deepcopy(net), "classification", backend=backend,
                             prior_precision=TAU)
    la.fit(DataLoader(TensorDataset(x, y), batch_size=7))
    return la.H_facs


def layer_blocks(factors, net):
    """Per K-FAC layer: (module, our A, our G, index of its weight block in laplace-torch's
    list of factors, whether a bias block follows)."""
    modules, out, i = dict(net.named_modules()), [], 0
    for name, (a, g) in factors.items():
        module = modules[name]
        out.append((module, a, g, i, module.bias is not None))
        i += 1 + (module.bias is not None)
    return out


def parameter_order(out_dim, in_dim, bias):
    """Positions of ``(W row-major, b)`` in the row-major ``vec`` of our (out, in [+ 1])
    matrix: ``kron(G, A)[order][:, order]`` is in laplace-torch's parameter order."""
    cols = in_dim + bias
    weights = [o * cols + i for o in range(out_dim) for i in range(in_dim)]
    return weights + ([o * cols + in_dim for o in range(out_dim)] if bias else [])


def assert_within(ours, theirs, tol, what):
    err = float((ours - theirs).abs().max())
    assert ours.shape == theirs.shape and err <= tol, (what, tuple(ours.shape),
                                                       tuple(theirs.shape), err, tol)


@pytest.mark.parametrize("backend", [AsdlEF, CurvlinopsEF], ids=["asdl", "curvlinops"])
@pytest.mark.parametrize("name", list(NETS))
def test_kronecker_factors_match_laplace_torch(name, backend):
    """``B = N G``, laplace-torch's ``A`` = ours without the bias row and column, and the
    network's whole Kronecker-factored empirical Fisher: ours, ``N (G ⊗ A)`` per layer in
    parameter order with the weight-bias blocks set to 0, equals theirs."""
    _, state, x, y = problem(name)
    ours = kfac_factors(state, [(x[i:i + 5], y[i:i + 5]) for i in range(0, N, 5)])
    theirs = reference(state.net, x, y, backend)
    blocks = []
    for (module, a, g, i, bias), rows in zip(layer_blocks(ours, state.net), NETS[name][3]):
        tol_a, tol_g = (8 * math.sqrt(N * rows) * EPS * float(f.diagonal().max())
                        for f in (a, N * g))
        b, a_ref = theirs.kfacs[i]
        assert_within(N * g, b, tol_g, "B")
        assert_within(a[:-1, :-1] if bias else a, a_ref, tol_a, "A")
        if bias:
            assert float(a[-1, -1]) == 1.0  # so the bias block N A_bb G is N G
            assert_within(N * g, theirs.kfacs[i + 1][0], tol_g, "bias block B")
        order = parameter_order(len(g), len(a) - bias, bias)
        fisher = N * torch.kron(g, a)[order][:, order]
        if bias:
            n_w = len(order) - len(g)
            fisher[:n_w, n_w:] = fisher[n_w:, :n_w] = 0  # laplace-torch's separate bias block
        blocks.append(fisher)
    ours_all, theirs_all = torch.block_diag(*blocks), theirs.to_matrix()
    n_rows = N * max(NETS[name][3])
    assert_within(ours_all, theirs_all,
                  8 * math.sqrt(n_rows) * EPS * float(ours_all.diagonal().max()), "N G ⊗ A")


@pytest.mark.parametrize("name", list(NETS))
def test_damped_precision_is_laplace_torchs_on_rebalanced_factors(name):
    """Our damped precision ``N (G_d ⊗ A_d)`` (from the inverse Cholesky factors we sample
    with) on every weight block equals laplace-torch's damped ``(B/c + sqrt(tau) I) ⊗ (c A +
    sqrt(tau) I)``, ``c = sqrt(N) / pi``; on the bias block ``(1 + pi sqrt(eps)) (B +
    sqrt(tau N) / pi I)``, with ``pi`` from laplace-torch's factors (ours counts the bias
    column: ``tr A_full = tr A + 1``)."""
    _, state, x, y = problem(name)
    kfac_factors(state, [(x[i:i + 5], y[i:i + 5]) for i in range(0, N, 5)])
    theirs = reference(state.net, x, y, CurvlinopsEF)
    eps = TAU / N
    posterior = _kfac_posterior(state)
    kfacs = [[f.clone() for f in fs] for fs in theirs.kfacs]
    expected_bias, layout, i = [], [], 0
    for (module, left, right), rows in zip(posterior, NETS[name][3]):
        bias = module.bias is not None
        b, a = kfacs[i]
        pi = math.sqrt(((a.trace() + bias) / (len(a) + bias)) / (b.trace() / N / len(b)))
        c = math.sqrt(N) / pi
        kfacs[i] = [b / c, c * a]
        eye = torch.eye(len(b), dtype=b.dtype)
        if bias:
            expected_bias.append((1 + pi * math.sqrt(eps)) * (b + math.sqrt(TAU * N) / pi * eye))
        # condition numbers of the damped factors, for the tolerance
        kappa = sum(len(f) * float(torch.linalg.cond(f + d * torch.eye(len(f), dtype=f.dtype)))
                    for f, d in ((b / N, math.sqrt(eps) / pi), (a, pi * math.sqrt(eps))))
        layout.append((module, left, right, i, bias, math.sqrt(N * rows) + kappa))
        i += 1 + bias
    decomposed = Kron(kfacs).decompose(damping=True)
    damped = KronDecomposed(decomposed.eigenvectors, decomposed.eigenvalues,
                            torch.full((len(kfacs),), TAU, dtype=torch.float64), damping=True)
    sizes = [math.prod(len(f) for f in fs) for fs in kfacs]
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    theirs_p = damped.to_matrix()
    for module, left, right, i, bias, terms in layout:
        g_d, a_d = torch.linalg.inv(left @ left.T), torch.linalg.inv(right.T @ right)
        order = parameter_order(len(g_d), len(a_d) - bias, bias)
        ours_p = N * torch.kron(g_d, a_d)[order][:, order]
        n_w, s = sizes[i], starts[i]
        tol = 8 * terms * EPS * float(ours_p.diagonal().max())
        assert_within(ours_p[:n_w, :n_w], theirs_p[s:s + n_w, s:s + n_w], tol, "weight block")
        if bias:
            assert_within(ours_p[n_w:, n_w:], expected_bias.pop(0), tol, "bias block")


def test_samples_have_the_damped_covariance_times_the_noise_scale():
    """Draws at scale ``s`` of the CNN: ``delta = w - w_MAP`` per layer as the (out, in + 1)
    matrix ``D``, ``q = N tr(G_d D A_d D^T) / s^2`` with the damped factors of the formula
    built from our factors; summed over layers and ``k`` draws it is ``chi^2`` with ``k``
    times the number of parameters as degrees of freedom (exact for Gaussian draws), within
    its two-sided 1e-3 quantiles (about 2 %: a lost ``s``, ``sqrt`` or ``N^(-1/2)`` moves it
    by a factor)."""
    s, k = 0.3, 300
    method, state, x, y = problem("cnn", scales=(s,))
    method.finish(state, [(x[i:i + 5], y[i:i + 5]) for i in range(0, N, 5)], None)
    eps = TAU / N
    layers = []
    for name, module in state.net.named_modules():
        if f"kfac.{name}.A" not in state.extra:
            continue
        a, g = state.extra[f"kfac.{name}.A"], state.extra[f"kfac.{name}.G"]
        pi = math.sqrt((a.trace() / len(a)) / (g.trace() / len(g)))
        a_d = a + pi * math.sqrt(eps) * torch.eye(len(a), dtype=a.dtype)
        g_d = g + math.sqrt(eps) / pi * torch.eye(len(g), dtype=g.dtype)
        layers.append((module, module.weight.detach().clone(), module.bias.detach().clone(),
                       a_d, g_d))
    total = 0.0
    with torch.no_grad():
        for net in method.samples(state, k, seed=1):
            for module, w0, b0, a_d, g_d in layers:
                d = torch.cat([(module.weight - w0).reshape(len(w0), -1),
                               (module.bias - b0)[:, None]], 1)
                total += float(N * (g_d @ d @ a_d * d).sum()) / s**2
    dof = k * sum(len(a_d) * len(g_d) for *_, a_d, g_d in layers)
    lo, hi = scipy.stats.chi2.ppf([5e-4, 1 - 5e-4], dof)
    assert lo <= total <= hi, (total, dof, lo, hi)
