"""Ensembles: averaged predictions, metric-vs-size curves and the deep ensemble equivalent.

Member predictions are log-probabilities with ONE explicit leading ensemble axis ``member``:
shape ``(member, n, C)`` (docs/conventions.md#s-3). The ensemble averages probabilities,
``log pbar = logsumexp_k(log p_k) - log K``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
from scipy.special import logsumexp

from ._validation import (
    PROB_SUM_ATOL,
    as_numpy,
    check_finite,
    check_labels,
    check_ndim,
    check_positive_int,
    check_same_length,
    check_seed,
    float_array,
)
from .calibration import temperature_scaled_metrics
from .conventions import CONVENTIONS
from .scoring import Confidence, Scorer

__all__ = [
    "DEE_BOUNDS_CONVENTION",
    "DeepEnsembleEquivalent",
    "deep_ensemble_equivalent",
    "deep_ensemble_equivalent_curve",
    "ensemble_log_probs",
    "ensemble_probs",
    "ensemble_size_curve",
]


#: How :func:`deep_ensemble_equivalent_curve` and :func:`ensemble_size_curve` make the DEE
#: bounds (docs/conventions.md#s-3); recorded in result attrs.
DEE_BOUNDS_CONVENTION = (
    "S.3: DEE bounds from the deep ensemble's mean -/+ sample std (ddof=1) over member orders; "
    "order o redraws the test_cv halves (seed + o) and, for members with several augmentation "
    "draws, uses draw o mod n_draws of every member")


def _check_member_log_probs(member_log_probs: Any, *, draws: bool = False) -> np.ndarray:
    if draws:
        lp = as_numpy(member_log_probs, "member_log_probs")
        if lp.ndim == 3:
            lp = lp[None]
        lp = float_array(lp, "member_log_probs", 4, "(member, n_samples, n_classes) or "
                         "(draw, member, n_samples, n_classes)")
    else:
        lp = float_array(member_log_probs, "member_log_probs", 3,
                         "(member, n_samples, n_classes)")
    if lp.shape[-1] < 2:
        raise ValueError(f"member_log_probs must have at least 2 classes, got shape {lp.shape}")
    total = logsumexp(lp, axis=-1)
    bad = np.abs(total) > PROB_SUM_ATOL
    if bad.any():
        *_, k, i = (int(j) for j in np.argwhere(bad)[0])
        raise ValueError(
            "member_log_probs must be normalised log-probabilities (exp summing to 1 over "
            f"classes, atol {PROB_SUM_ATOL}); member {k}, row {i} sums to "
            f"{np.exp(total[bad][0]):.6g} (pass log_softmax(logits), not logits)"
        )
    return lp


def ensemble_log_probs(member_log_probs: Any) -> np.ndarray:
    """Log of the ensemble's averaged probabilities.

    Parameters
    ----------
    member_log_probs : array_like of float, shape (member, n, C)
        Members' log-probabilities (e.g. ``log_softmax`` of each member's logits); finite,
        each row's ``exp`` summing to 1 (within 1e-4).

    Returns
    -------
    numpy.ndarray of float64, shape (n, C)
        ``log pbar``.

    Notes
    -----
    ``log pbar_ic = logsumexp_k(log p_kic) - log K`` (docs/conventions.md#s-3), computed in log
    space so that tiny member probabilities are not lost.

    References
    ----------
    Lakshminarayanan, Pritzel, Blundell. Simple and scalable predictive uncertainty estimation
    using deep ensembles. NeurIPS 2017.

    Examples
    --------
    >>> lp = np.log([[[0.9, 0.1]], [[0.5, 0.5]]])
    >>> np.exp(ensemble_log_probs(lp))
    array([[0.7, 0.3]])
    """
    lp = _check_member_log_probs(member_log_probs)
    return logsumexp(lp, axis=0) - np.log(lp.shape[0])


def ensemble_probs(member_log_probs: Any) -> np.ndarray:
    """The ensemble's averaged probabilities, ``exp`` of :func:`ensemble_log_probs`.

    Parameters
    ----------
    member_log_probs : array_like of float, shape (member, n, C)
        Members' log-probabilities.

    Returns
    -------
    numpy.ndarray of float64, shape (n, C)
        ``pbar = (1/K) sum_k p_k``.

    Examples
    --------
    >>> ensemble_probs(np.log([[[0.8, 0.2]], [[0.2, 0.8]]]))
    array([[0.5, 0.5]])
    """
    return np.exp(ensemble_log_probs(member_log_probs))


def ensemble_size_curve(
    member_log_probs: Any,
    labels: Any,
    *,
    metrics: Sequence[str] = ("accuracy", "nll", "brier", "ece"),
    confidence: Confidence = "softmax_response",
    n_orders: int = 5,
    seed: int = 0,
    calibrated: bool = False,
    n_repeats: int = 5,
    calibrated_metrics: Sequence[str] = (),
    redraw_splits: bool = True,
) -> xr.Dataset:
    """Metrics of the ensemble of the first ``s`` members, for ``s = 1..K`` and several orders.

    Parameters
    ----------
    member_log_probs : array_like of float, shape (member, n, C) or (draw, member, n, C)
        Members' log-probabilities on the same test samples. With a leading ``draw`` axis
        (e.g. one random test-time augmentation per draw and member), order ``o`` uses draw
        ``o mod n_draws`` of every member, so the orders also redraw the members' noise.
    labels : array_like of int, shape (n,)
        Test labels in ``[0, C)``.
    metrics : sequence of str
        Registered classification or selective metrics (``uqmetrics.metrics.registry``), scored by
        :func:`uqmetrics.score_metrics`.
    confidence : str or callable, default "softmax_response"
        The confidence κ of the selective metrics, a function of the prefix ensemble's
        probabilities ``pbar_s``; see :func:`uqmetrics.score_metrics`.
    n_orders : int, default 5
        Number of member orders; order 0 is the identity ``0..K-1``, the others are random
        permutations from ``numpy.random.default_rng(seed)``.
    seed : int, default 0
        Seed of the orders and of the ``test_cv`` splits.
    calibrated : bool, default False
        Also compute ``cll``, the calibrated log-likelihood (``test_cv`` temperature scaling of
        the ensemble's log-probabilities treated as logits; higher is better).
    n_repeats : int, default 5
        ``test_cv`` repeats for the calibrated metrics.
    calibrated_metrics : sequence of str, default ()
        Registered classification metrics also reported after ``test_cv`` temperature scaling,
        as ``calibrated_<name>`` (e.g. ``("brier",)`` gives ``calibrated_brier``); they share
        the folds (and fitted temperatures) of ``cll``.
    redraw_splits : bool, default True
        Order ``o`` uses the ``test_cv`` seed ``seed + o`` (docs/conventions.md#s-3: the spread
        over orders carries the split noise, as the official code's does); ``False``: every
        cell uses ``seed`` (same splits everywhere).

    Returns
    -------
    xarray.Dataset
        One variable per metric (plus ``cll`` and ``calibrated_<name>``) over dims
        ``(order, size)`` with coords ``order = 0..n_orders-1`` and ``size = 1..K``;
        ``member_order`` ``(order, position)`` holds the permutations, ``split_seed`` and
        ``draw`` ``(order,)`` the ``test_cv`` seed and the draw of every order. Average over
        ``order`` for the mean curve.

    Notes
    -----
    For order ``pi`` and size ``s``: ``log pbar_s = logsumexp_{j<s} log p_{pi(j)} - log s``, and
    each metric is evaluated on ``exp(log pbar_s)`` by :func:`uqmetrics.score_metrics`
    (selective metrics with ``correct = argmax pbar_s = y`` and ``κ = confidence(pbar_s)``).
    Within one order every size uses the same ``test_cv`` splits, so an order's curve is not
    blurred by split noise; across orders the splits differ (``redraw_splits``).

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020.

    Examples
    --------
    >>> lp = np.log([[[0.9, 0.1], [0.4, 0.6]], [[0.6, 0.4], [0.2, 0.8]]])
    >>> ds = ensemble_size_curve(lp, [0, 1], metrics=("accuracy",), n_orders=2)
    >>> dict(ds["accuracy"].sizes)
    {'order': 2, 'size': 2}
    """
    lp = _check_member_log_probs(member_log_probs, draws=True)
    n_draws, n_members, _, n_classes = lp.shape
    y = check_labels(labels, n_classes)
    check_same_length(labels=y, member_log_probs=lp[0, 0])
    if "cll" in metrics:
        raise ValueError("metrics must not contain 'cll'; pass calibrated=True to compute it")
    scorer = Scorer.build(metrics, confidence)
    calibrated_metrics = tuple(calibrated_metrics)
    cal_scorer = Scorer.build(calibrated_metrics) if calibrated_metrics else None
    if cal_scorer is not None and any(sp.kind != "classification" for sp in cal_scorer.specs):
        raise ValueError(f"calibrated_metrics must be classification metrics, got "
                         f"{list(calibrated_metrics)}")
    n_orders = check_positive_int(n_orders, "n_orders")
    n_repeats = check_positive_int(n_repeats, "n_repeats")
    seed = check_seed(seed)
    calibrated = bool(calibrated)
    ts_metrics = tuple(dict.fromkeys((("nll",) if calibrated else ()) + calibrated_metrics))

    rng = np.random.default_rng(seed)
    orders = np.stack([np.arange(n_members)]
                      + [rng.permutation(n_members) for _ in range(n_orders - 1)])
    split_seeds = np.array([seed + o if redraw_splits else seed for o in range(n_orders)])
    draws = np.arange(n_orders) % n_draws
    cal_names = (["cll"] if calibrated else []) + [f"calibrated_{m}" for m in calibrated_metrics]
    names = scorer.names + cal_names
    values = {m: np.empty((n_orders, n_members)) for m in names}
    for o, perm in enumerate(orders):
        member = lp[draws[o]]
        running = member[perm[0]]
        for s in range(1, n_members + 1):
            if s > 1:
                running = np.logaddexp(running, member[perm[s - 1]])
            mean_lp = running - np.log(s)
            for name, value in scorer(y, np.exp(mean_lp)).items():
                values[name][o, s - 1] = value
            if ts_metrics:
                ts = temperature_scaled_metrics(mean_lp, y, protocol="test_cv",
                                                metrics=ts_metrics, n_repeats=n_repeats,
                                                seed=int(split_seeds[o]))
                ts = ts.sel(calibration="temperature")
                if calibrated:
                    values["cll"][o, s - 1] = -float(ts["nll"])
                for m in calibrated_metrics:
                    values[f"calibrated_{m}"][o, s - 1] = float(ts[m])

    data = {sp.name: xr.Variable(("order", "size"), values[sp.name],
                                 attrs=scorer.metric_attrs(sp))
            for sp in scorer.specs}
    if calibrated:
        data["cll"] = xr.Variable(
            ("order", "size"), values["cll"],
            attrs={"greater_is_better": 1,
                   "convention": "S.1: mean log-likelihood after test_cv temperature scaling"})
    if cal_scorer is not None:
        for sp in cal_scorer.specs:
            attrs = cal_scorer.metric_attrs(sp)
            attrs["convention"] = f"after test_cv temperature scaling; {attrs['convention']}"
            data[f"calibrated_{sp.name}"] = xr.Variable(
                ("order", "size"), values[f"calibrated_{sp.name}"], attrs=attrs)
    data["member_order"] = (("order", "position"), orders)
    data["split_seed"] = ("order", split_seeds)
    data["draw"] = ("order", draws)
    return xr.Dataset(
        data,
        coords={"order": np.arange(n_orders), "size": np.arange(1, n_members + 1),
                "position": np.arange(n_members)},
        attrs={"n_orders": n_orders, "seed": seed, "calibrated": int(bool(calibrated)),
               "n_repeats": n_repeats, "n_draws": n_draws,
               "redraw_splits": int(bool(redraw_splits)),
               "convention": CONVENTIONS["ensemble"], **scorer.attrs},
    )


# --------------------------------------------------------------------------------------------
# Deep ensemble equivalent
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepEnsembleEquivalent:
    """Result of :func:`deep_ensemble_equivalent` (floats for a scalar input, else arrays).

    Attributes
    ----------
    dee : float or numpy.ndarray
        Deep ensemble equivalent (from the DE mean curve).
    lower, upper : float or numpy.ndarray
        Bounds from the curves ``mean + std`` (reached sooner: lower) and ``mean - std``.
        Equal to ``dee`` when no std is given.
    capped : bool or numpy.ndarray of bool
        True where the DE mean curve never reaches the method's CLL; ``dee`` is then ``cap``.
    cap : float
        The largest DE size measured (every value is at most ``cap``).
    """

    dee: Any
    lower: Any
    upper: Any
    capped: Any
    cap: float


def _first_reach(target: np.ndarray, sizes: np.ndarray, curve: np.ndarray):
    """Smallest ``l`` in ``[sizes[0], sizes[-1]]`` with ``interp(l) >= target``; capped flags."""
    t = target[:, None]
    candidates = np.where(curve[None, :] >= t, sizes[None, :], np.inf)  # at the vertices
    if sizes.shape[0] > 1:
        f0, f1 = curve[:-1][None, :], curve[1:][None, :]
        s0, s1 = sizes[:-1][None, :], sizes[1:][None, :]
        inside = (f0 < t) & (f1 >= t)  # crossing within the open segment (s0, s1]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(inside, (t - f0) / np.where(inside, f1 - f0, 1.0), 0.0)
        seg = np.where(inside, s0 + frac * (s1 - s0), np.inf)
        candidates = np.concatenate([candidates, seg], axis=1)
    first = candidates.min(axis=1)
    capped = ~np.isfinite(first)
    return np.where(capped, sizes[-1], first), capped


def deep_ensemble_equivalent(
    method_cll: Any,
    de_sizes: Any,
    de_cll_mean: Any,
    de_cll_std: Any = None,
    *,
    greater_is_better: bool = True,
) -> DeepEnsembleEquivalent:
    """Deep ensemble equivalent (DEE): the deep-ensemble size that matches a method's CLL.

    Parameters
    ----------
    method_cll : float or array_like of float, shape (m,)
        The method's mean calibrated log-likelihood (higher is better), e.g. one per number of
        samples ``k``.
    de_sizes : array_like of float, shape (S,)
        Deep-ensemble sizes at which the curve was measured, strictly increasing, ``>= 1``
        (usually ``1..K``).
    de_cll_mean : array_like of float, shape (S,)
        Deep ensemble's mean CLL at those sizes (mean over member orders).
    de_cll_std : array_like of float, shape (S,), optional
        Its standard deviation, for the lower/upper bounds.
    greater_is_better : bool, default True
        False for a loss (NLL, Brier, error): "reaches" then means "is at most", and the
        bounds use ``mean - std`` (lower) / ``mean + std`` (upper). The DEE of other metrics
        (Pitfalls, appendix C) is defined this way.

    Returns
    -------
    DeepEnsembleEquivalent
        ``dee``, ``lower``, ``upper``, ``capped``, ``cap`` (floats/bool for a scalar
        ``method_cll``, arrays of its shape otherwise).

    Notes
    -----
    ``DEE_m = min{l >= 1 : CLL_DE^mean(l) >= CLL_m}`` with ``CLL_DE^mean`` linearly interpolated
    between the measured sizes (Ashukha et al., 2020, eq. 4; docs/conventions.md#s-3); the curve
    need not be monotone, the FIRST crossing counts. ``lower``/``upper`` use ``mean + std`` /
    ``mean - std`` (eq. 5). Conventions: a method at or below the smallest measured ensemble
    (normally the single network) gets ``de_sizes[0]`` (= 1); a method above the whole curve
    gets the cap ``de_sizes[-1]`` with ``capped=True`` (its true DEE is at least the cap).
    At a measured size ``k`` whose value exceeds all earlier ones, the DE's own CLL gives
    ``DEE = k`` exactly.

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020, Section 4.1.

    Examples
    --------
    >>> r = deep_ensemble_equivalent(-0.75, [1, 2, 3], [-1.0, -0.5, -0.25], [0.125] * 3)
    >>> r.dee, r.lower, r.upper, r.capped
    (1.5, 1.25, 1.75, False)
    >>> deep_ensemble_equivalent([-2.0, 0.0], [1, 2, 3], [-1.0, -0.5, -0.25]).dee
    array([1., 3.])
    """
    c = as_numpy(method_cll, "method_cll")
    if c.dtype.kind not in "biuf":
        raise ValueError(f"method_cll must be numeric, got dtype {c.dtype}")
    scalar = c.ndim == 0
    c = np.atleast_1d(c.astype(np.float64))
    if c.size == 0:
        raise ValueError(f"method_cll is empty (shape {c.shape})")
    check_finite(c, "method_cll")
    sizes = float_array(de_sizes, "de_sizes", 1, "(n_sizes,)")
    if sizes[0] < 1 or np.any(np.diff(sizes) <= 0):
        raise ValueError(f"de_sizes must be strictly increasing and >= 1, got {sizes.tolist()}")
    mean = float_array(de_cll_mean, "de_cll_mean", 1, "(n_sizes,)")
    check_same_length(de_sizes=sizes, de_cll_mean=mean)
    if de_cll_std is None:
        std = np.zeros_like(mean)
    else:
        std = float_array(de_cll_std, "de_cll_std", 1, "(n_sizes,)")
        check_same_length(de_sizes=sizes, de_cll_std=std)
        if std.min() < 0:
            raise ValueError(f"de_cll_std must be >= 0, got minimum {std.min()!r}")

    sign = 1.0 if greater_is_better else -1.0
    flat, mean = sign * c.ravel(), sign * mean
    dee, capped = _first_reach(flat, sizes, mean)
    lower, _ = _first_reach(flat, sizes, mean + std)
    upper, _ = _first_reach(flat, sizes, mean - std)
    cap = float(sizes[-1])
    if scalar:
        return DeepEnsembleEquivalent(float(dee[0]), float(lower[0]), float(upper[0]),
                                      bool(capped[0]), cap)
    shape = c.shape
    return DeepEnsembleEquivalent(dee.reshape(shape), lower.reshape(shape), upper.reshape(shape),
                                  capped.reshape(shape), cap)


def deep_ensemble_equivalent_curve(
    method_values: Any,
    de_values: Any,
    *,
    greater_is_better: bool = True,
    ddof: int = 1,
) -> DeepEnsembleEquivalent:
    """DEE of a method at every number of samples, from both size curves over member orders.

    Parameters
    ----------
    method_values : array_like of float, shape (order, k)
        The method's metric (e.g. ``cll`` of :func:`ensemble_size_curve`) for sizes ``1..k``;
        trailing NaN sizes (a method with fewer samples than the array's width) are dropped.
    de_values : array_like of float, shape (order', S)
        The deep ensemble's values of the same metric for sizes ``1..S`` (NaN trailing sizes
        dropped likewise).
    greater_is_better : bool, default True
        The metric's direction (``cll``, accuracy: True; NLL, Brier: False).
    ddof : int, default 1
        Delta degrees of freedom of the deep ensemble's std over orders
        (docs/conventions.md#s-3: the sample std). With a single order the std is taken as 0
        (bounds = DEE).

    Returns
    -------
    DeepEnsembleEquivalent
        Arrays of shape ``(k,)``: DEE of the method's mean (over orders) at each size, its
        bounds, the capped flags; ``cap`` = the largest deep-ensemble size.

    Notes
    -----
    ``DEE_m(k) = min{l >= 1 : mean_DE(l) >= mean_m(k)}`` with the deep ensemble's mean curve
    interpolated linearly between sizes; bounds from ``mean_DE -/+ std_DE`` (Ashukha et al.,
    2020, eqs. 4-5; :func:`deep_ensemble_equivalent`). The spread is honest only if each order
    redraws what varies between evaluations (``ensemble_size_curve``'s ``redraw_splits`` and
    draws; :data:`DEE_BOUNDS_CONVENTION`).

    Examples
    --------
    >>> de = np.array([[-1.0, -0.5, -0.25], [-1.0, -0.6, -0.25]])
    >>> r = deep_ensemble_equivalent_curve([[-1.0, -0.55]], de)
    >>> r.dee.tolist()
    [1.0, 2.0]
    """
    ddof = int(ddof)
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof!r}")

    def measured(x: Any, name: str) -> np.ndarray:
        v = as_numpy(x, name)
        if v.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be numeric, got dtype {v.dtype}")
        v = check_ndim(v.astype(np.float64), name, 2, "(order, size)")
        ok = np.isfinite(v).all(axis=0)
        k = int(np.argmin(ok)) if not ok.all() else v.shape[1]
        if k == 0 or not np.isnan(v[:, k:]).all():
            raise ValueError(f"{name} must be finite for sizes 1..k and NaN beyond, got "
                             f"{v.tolist()}")
        return v[:, :k]

    method, de = measured(method_values, "method_values"), measured(de_values, "de_values")
    mean = de.mean(axis=0)
    std = de.std(axis=0, ddof=ddof) if de.shape[0] > ddof else np.zeros_like(mean)
    sizes = np.arange(1, de.shape[1] + 1, dtype=float)
    return deep_ensemble_equivalent(method.mean(axis=0), sizes, mean, std,
                                    greater_is_better=greater_is_better)
