"""Ovadia et al. (2019)'s claims about uncertainty under shift, tested on a ``shift`` result.

:func:`shift_findings` turns a result of :func:`~.score.score_shift` into one row per claim and
predictor, each with its statistic and a one-sided sign test (:func:`scipy.stats.binomtest`):

- **calibration worsens with severity** (per predictor and calibration): the corruptions
  whose ECE at the highest severity exceeds the clean ECE, ``k`` of ``n``.
- **temperature scaling helps in distribution** (the paper's first half of its temperature
  claim; one row over every row of the result): the predictors whose temperature-scaled clean
  ECE is below their un-scaled clean ECE.
- **temperature scaling does not survive shift** (its second half; per predictor): the
  (corruption, severity) cells where the temperature-scaled ECE exceeds the un-scaled one.
  The statistic gives the fitted temperature: ``T > 1`` softens an over-confident softmax,
  whose benefit the paper finds fading under shift; ``T < 1`` (an under-confident network on
  clean data) sharpens it, and makes the network more over-confident under shift: another
  mechanism for the same count.
- **ensembles degrade most gracefully** (the ensemble row against the vanilla network and
  each MC-dropout network): the (corruption, severity) cells of the upper severities
  (``severity >= min_severity``) where the ensemble is better, per metric of
  :data:`RANKED_METRICS` (higher accuracy; lower NLL, Brier, ECE) and calibration.
- **MC dropout ranks between the vanilla network and the ensemble** (per MC-dropout network
  and ensemble): ``MC dropout beats <vanilla> (<metric>)`` counts the same cells where the
  dropout network is better than the vanilla one; ``ensemble beats <dropout>`` is the other
  half. The row ``MC dropout ranks between ... (<metric>)`` holds where both halves do: it
  repeats the half with the larger p-value (an intersection-union test, level ``ALPHA``).

A tie counts against the claim. A claim over too few cells or rows for any count to reach
``p < ALPHA`` (``0.5 ** n >= ALPHA``: ``n <= 4``) is ``untestable``. The cells share their
images (every corruption of one test set), so they are not independent draws: the sign test's
p-value is a guide, not an exact error rate (docs/conventions.md#v-5).
:func:`format_findings` writes the rows as a markdown table.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..findings import ALPHA, Finding, findings_table, sign_finding

__all__ = ["ALPHA", "RANKED_METRICS", "ShiftFinding", "format_findings", "shift_findings"]

#: The metrics the predictors are ranked on (Ovadia et al. 2019, Fig. 2 and its NLL tables);
#: accuracy is greater-is-better, the others lower-is-better. Temperature scaling never moves
#: accuracy, so accuracy is compared un-scaled only.
RANKED_METRICS = ("accuracy", "nll", "brier", "ece")
_GREATER_IS_BETTER = frozenset({"accuracy"})


#: The rows of :func:`shift_findings` (its subject: the predictor; its condition: the
#: calibration).
ShiftFinding = Finding


def _means(a: np.ndarray, b: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The means of ``a`` and ``b`` over the cells where both are present, and that mask."""
    ok = ~(np.isnan(a) | np.isnan(b))
    return (float(np.mean(a[ok])) if ok.any() else np.nan,
            float(np.mean(b[ok])) if ok.any() else np.nan, ok)


def _beats(result: xr.Dataset, claim: str, better: str, other: str, metric: str, cal: str,
           upper: np.ndarray, min_severity: int) -> Finding:
    """``better`` beats ``other`` on ``metric`` in the upper-severity cells."""
    a = result[metric].sel(model=better, calibration=cal).values[:, upper]
    b = result[metric].sel(model=other, calibration=cal).values[:, upper]
    before, after, ok = _means(b, a)
    wins = a[ok] > b[ok] if metric in _GREATER_IS_BETTER else a[ok] < b[ok]
    word = "higher" if metric in _GREATER_IS_BETTER else "lower"
    return sign_finding(claim, better, cal,
                        f"cells (corruption, severity >= {min_severity}) with {word} {metric}",
                        before, after, wins)


def _temperature(result: xr.Dataset, model: str) -> str:
    """`` (fitted T = 0.88: sharpens)``, or nothing where the result has no temperature."""
    if "temperature" not in result:
        return ""
    t = float(result["temperature"].sel(model=model))
    what = "sharpens" if t < 1 else "softens" if t > 1 else "identity"
    return f" (fitted T = {t:.3g}: {what})" if np.isfinite(t) else ""


def shift_findings(result: xr.Dataset, *, vanilla: str | None = None,
                   min_severity: int = 3) -> list[Finding]:
    """Test the paper's claims on a ``shift`` result (module docstring).

    Parameters
    ----------
    result : xarray.Dataset
        A result of :func:`~.score.score_shift` with corrupted members: ``accuracy``, ``nll``,
        ``brier``, ``ece`` (model, corruption, severity, calibration), ``clean_ece`` (model,
        calibration); optionally ``temperature`` (model).
    vanilla : str, optional
        The single network the ensemble is compared with first (Ovadia's *vanilla*); default
        the first single model. The ensemble is also compared with every other single model
        whose name has ``mc_dropout``, and those with the vanilla network.
    min_severity : int, default 3
        The lowest severity of the cells of the ensemble and MC-dropout claims.

    Returns
    -------
    list of Finding
        The calibration claim for the vanilla network, the MC-dropout networks and the
        ensembles (each calibration); the two temperature claims (one row over every row of
        the result, then one per predictor of the calibration claim); the ensemble claims against each
        compared predictor; the MC-dropout claims (against the vanilla network, then the
        ranking per ensemble). Each of the last two per metric of :data:`RANKED_METRICS` and
        calibration (accuracy un-scaled only).

    Raises
    ------
    uqmetrics.InputError
        A result without corrupted members or the variables above, an unknown ``vanilla``.
    """
    for var in (*RANKED_METRICS, "clean_ece"):
        if var not in result:
            raise InputError(f"result has no variable {var!r}: not a shift result "
                             "(uqvision score shift)")
    if result.sizes.get("severity", 0) == 0:
        raise InputError("result has no corrupted members (its severity dimension is empty)")
    models = [str(m) for m in result["model"].values]
    kinds = ([str(k) for k in result["kind"].values] if "kind" in result.coords
             else ["single"] * len(models))
    singles = [m for m, k in zip(models, kinds, strict=True) if k == "single"]
    ensembles = [m for m, k in zip(models, kinds, strict=True) if k == "ensemble"]
    if vanilla is None and singles:
        vanilla = singles[0]
    if vanilla is not None and vanilla not in models:
        raise InputError(f"vanilla {vanilla!r} is not a row of the result; rows: {models}")
    dropout = [m for m in singles if "mc_dropout" in m]
    shown = [m for m in [vanilla, *dropout, *ensembles] if m is not None]
    calibrations = result["calibration"].values.tolist()
    top = int(result["severity"].max())
    rows = []
    for model in shown:
        for cal in calibrations:
            ece = result["ece"].sel(model=model, calibration=cal, severity=top).values
            clean = float(result["clean_ece"].sel(model=model, calibration=cal))
            ok = ~np.isnan(ece)
            rows.append(sign_finding(
                "calibration worsens with severity", model, cal,
                f"corruptions with ECE at severity {top} > clean ECE",
                clean, np.mean(ece[ok]) if ok.any() else np.nan, ece[ok] > clean))
    if {"none", "temperature"} <= set(calibrations):
        clean = result["clean_ece"].sel(model=models)
        none, scaled, ok = _means(clean.sel(calibration="none").values,
                                  clean.sel(calibration="temperature").values)
        c0, c1 = (clean.sel(calibration=c).values[ok] for c in ("none", "temperature"))
        rows.append(sign_finding(
            "temperature scaling helps in distribution", f"every row ({int(ok.sum())})",
            "temperature", "rows with temperature-scaled clean ECE < un-scaled clean ECE",
            none, scaled, c1 < c0))
        for model in shown:
            a, b = (result["ece"].sel(model=model, calibration=c).values
                    for c in ("none", "temperature"))
            none, scaled, ok = _means(a, b)
            rows.append(sign_finding(
                "temperature scaling does not survive shift", model, "temperature",
                "cells (corruption, severity) with temperature-scaled ECE > un-scaled ECE"
                + _temperature(result, model), none, scaled, b[ok] > a[ok]))
    upper = result["severity"].values >= min_severity
    pairs = [(metric, cal) for metric in RANKED_METRICS for cal in calibrations
             if metric not in _GREATER_IS_BETTER or cal == "none"]
    for ens in ensembles:
        for other in [m for m in [vanilla, *dropout] if m is not None]:
            for metric, cal in pairs:
                rows.append(_beats(result, f"ensemble beats {other} ({metric})", ens, other,
                                   metric, cal, upper, min_severity))
    if vanilla is not None:
        for drop in [m for m in dropout if m != vanilla]:
            halves = {}
            for metric, cal in pairs:
                halves[metric, cal] = _beats(result, f"MC dropout beats {vanilla} ({metric})",
                                             drop, vanilla, metric, cal, upper, min_severity)
                rows.append(halves[metric, cal])
            for ens in ensembles:
                for metric, cal in pairs:
                    other = _beats(result, f"ensemble beats {drop} ({metric})", ens, drop,
                                   metric, cal, upper, min_severity)
                    weaker = max(halves[metric, cal], other,  # a half with no cell (NaN) binds
                                 key=lambda f: (np.isnan(f.p_value), f.p_value))
                    rows.append(Finding(
                        f"MC dropout ranks between {vanilla} and {ens} ({metric})", drop, cal,
                        f"the half with the larger p, {weaker.claim.rsplit(' (', 1)[0]}: "
                        + weaker.statistic, weaker.before, weaker.after, weaker.k, weaker.n,
                        weaker.p_value, weaker.verdict))
    return rows


def format_findings(findings: list[Finding]) -> str:
    """The findings as a markdown table (one row each), with the test's level."""
    return findings_table(findings, ("claim", ("subject", "predictor"),
                                     ("condition", "calibration"), "statistic"), ALPHA)
