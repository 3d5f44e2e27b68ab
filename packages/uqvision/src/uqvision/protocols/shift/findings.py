"""Ovadia et al. (2019)'s claims about uncertainty under shift, tested on a ``shift`` result.

:func:`shift_findings` turns a result of :func:`~.score.score_shift` into one row per claim and
predictor, each with its statistic and a one-sided sign test (:func:`scipy.stats.binomtest`):

- **calibration worsens with severity** (per predictor and calibration): the corruptions
  whose ECE at the highest severity exceeds the clean ECE, ``k`` of ``n``. The claim holds
  for the temperature-scaled rows too: a temperature fitted on clean data does not survive
  shift.
- **ensembles degrade most gracefully** (the ensemble row against each other predictor): the
  (corruption, severity) cells of the upper severities (``severity >= min_severity``) where
  the ensemble's Brier score, and separately its ECE, is lower than the other predictor's.

The cells share their images (every corruption of one test set), so they are not independent
draws: the sign test's p-value is a guide, not an exact error rate (docs/conventions.md#v-5).
:func:`format_findings` writes the rows as a markdown table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..base import findings_table, sign_verdict

__all__ = ["ALPHA", "ShiftFinding", "format_findings", "shift_findings"]

#: The level of the one-sided sign tests: a claim is ``reproduced`` where ``p < ALPHA``.
ALPHA = 0.05


@dataclass(frozen=True)
class ShiftFinding:
    """One claim tested on one predictor.

    Attributes
    ----------
    claim : str
        ``calibration worsens with severity`` or ``ensemble beats <predictor> (<metric>)``.
    predictor : str
        The row of ``model`` the claim is about.
    calibration : str
        ``none`` or ``temperature``.
    statistic : str
        What was counted, in words.
    before, after : float
        The two means compared: clean and highest-severity ECE, or the other predictor's and
        the ensemble's metric over the cells.
    k, n : int
        Cells (corruptions) where the claim's inequality holds, out of those with both values.
    p_value : float
        One-sided sign test of ``k`` successes in ``n`` at probability 1/2.
    verdict : str
        ``reproduced`` (``p < ALPHA``) or ``not reproduced``.
    """

    claim: str
    predictor: str
    calibration: str
    statistic: str
    before: float
    after: float
    k: int
    n: int
    p_value: float
    verdict: str


def _finding(claim, predictor, calibration, statistic, before, after, wins) -> ShiftFinding:
    k, n, p, verdict = sign_verdict(wins, ALPHA)
    return ShiftFinding(claim, predictor, calibration, statistic, float(before), float(after),
                        k, n, p, verdict)


def shift_findings(result: xr.Dataset, *, vanilla: str | None = None,
                   min_severity: int = 3) -> list[ShiftFinding]:
    """Test the paper's claims on a ``shift`` result (module docstring).

    Parameters
    ----------
    result : xarray.Dataset
        A result of :func:`~.score.score_shift` with corrupted members: ``ece``, ``brier``
        (model, corruption, severity, calibration), ``clean_ece`` (model, calibration).
    vanilla : str, optional
        The single network the ensemble is compared with first (Ovadia's *vanilla*); default
        the first single model. The ensemble is also compared with every other single model
        whose name has ``mc_dropout``.
    min_severity : int, default 3
        The lowest severity of the cells of the ensemble claims.

    Returns
    -------
    list of ShiftFinding
        The calibration claim for the vanilla network, the MC-dropout networks and the
        ensembles (each calibration), then the ensemble claims (Brier, ECE; un-scaled and
        temperature-scaled) against each compared predictor.

    Raises
    ------
    uqmetrics.InputError
        A result without corrupted members or the variables above, an unknown ``vanilla``.
    """
    for var in ("ece", "brier", "clean_ece"):
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
    top = int(result["severity"].max())
    rows = []
    for model in [m for m in [vanilla, *dropout, *ensembles] if m is not None]:
        for cal in result["calibration"].values.tolist():
            ece = result["ece"].sel(model=model, calibration=cal, severity=top).values
            clean = float(result["clean_ece"].sel(model=model, calibration=cal))
            ok = ~np.isnan(ece)
            rows.append(_finding(
                "calibration worsens with severity", model, cal,
                f"corruptions with ECE at severity {top} > clean ECE",
                clean, np.mean(ece[ok]) if ok.any() else np.nan, ece[ok] > clean))
    upper = result["severity"].values >= min_severity
    for ens in ensembles:
        for other in [m for m in [vanilla, *dropout] if m is not None]:
            for metric in ("brier", "ece"):
                for cal in result["calibration"].values.tolist():
                    a = result[metric].sel(model=ens, calibration=cal).values[:, upper]
                    b = result[metric].sel(model=other, calibration=cal).values[:, upper]
                    ok = ~(np.isnan(a) | np.isnan(b))
                    rows.append(_finding(
                        f"ensemble beats {other} ({metric})", ens, cal,
                        f"cells (corruption, severity >= {min_severity}) with lower {metric}",
                        np.mean(b[ok]) if ok.any() else np.nan,
                        np.mean(a[ok]) if ok.any() else np.nan, a[ok] < b[ok]))
    return rows


def format_findings(findings: list[ShiftFinding]) -> str:
    """The findings as a markdown table (one row each), with the test's level."""
    return findings_table(findings, ("claim", "predictor", "calibration", "statistic"), ALPHA)
