"""untangle's findings, tested on the stand-in where the truth is exact (docs/conventions.md#v-8):
each a one-sided sign test over the predictors (:mod:`uqvision.protocols.findings`), with the
mean and a 95 % interval (Student t over the predictors) of the statistic in words.

- **entangled**: untangle's main claim (Mucsányi, Kirchhof & Oh 2024, "Benchmarking Uncertainty
  Disentanglement: Specialized Uncertainties for Specialized Tasks"): a predictor's aleatoric
  and epistemic estimates are almost perfectly rank-correlated; tested as the Spearman
  correlation of the expected entropy and the mutual information on the test images exceeding
  :data:`ENTANGLED` on the predictors with two or more members;
- **aleatoric specialised**: the aleatoric estimate ranks the true label entropy better than
  the epistemic one (Spearman with the truth, per predictor);
- **epistemic specialised**: the epistemic estimate detects the held-out families better than
  the aleatoric one (OOD AUROC, per predictor);
- **epistemic falls with data**: each method's mean epistemic estimate is lower on the whole
  training set than on its smallest subset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from uqmetrics import InputError

from ..findings import ALPHA, Finding, findings_table, mean_or_nan, sign_finding

__all__ = ["ENTANGLED", "disentangle_findings", "format_findings"]

#: "Almost perfectly rank-correlated": the Spearman correlation the main claim asks for.
ENTANGLED = 0.9
_ALE, _EPI = "expected_entropy", "mutual_information"


def _interval(x: np.ndarray) -> str:
    """``mean [lo, hi]``: the mean and its 95 % Student-t interval (``n < 2``: the mean)."""
    from scipy.stats import t as student

    x = x[np.isfinite(x)]
    if x.size < 2:
        return f"{mean_or_nan(x):.3f}"
    half = student.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return f"{x.mean():.3f} [{x.mean() - half:.3f}, {x.mean() + half:.3f}]"


def disentangle_findings(result: Any) -> list[Finding]:
    """The findings of a disentangle result (module docstring).

    Parameters
    ----------
    result : xarray.Dataset or path
        A result of :func:`~.score.score_disentangle`.

    Returns
    -------
    list of Finding
        A claim whose estimators or tasks are absent has no row.

    Raises
    ------
    uqmetrics.InputError
        Not a disentangle result.
    """
    from .score import read_scores

    ds = read_scores(result)
    for var in ("ae_spearman", "aleatoric_spearman", "ood_auroc"):
        if var not in ds:
            raise InputError(f"result has no variable {var!r}: not a disentangle result")
    rows = []
    multi = ds["members"].values >= 2
    if _ALE in ds["aleatoric"].values and _EPI in ds["epistemic"].values:
        rho = ds["ae_spearman"].sel(aleatoric=_ALE, epistemic=_EPI).values[multi]
        rho = rho[np.isfinite(rho)]
        rows.append(sign_finding(
            "aleatoric and epistemic estimates are almost perfectly rank-correlated",
            f"predictors with >= 2 members ({rho.size})", "",
            f"Spearman(expected entropy, mutual information) > {ENTANGLED} on the test "
            f"images; mean and 95 % t interval {_interval(rho)}",
            ENTANGLED, mean_or_nan(rho), rho > ENTANGLED, untestable=None))
        for var, what, better in (("aleatoric_spearman", "Spearman with the true entropy",
                                   "aleatoric"),
                                  ("ood_auroc", "OOD AUROC (held-out families)", "epistemic")):
            a = ds[var].sel(estimator=_ALE).values[multi]
            e = ds[var].sel(estimator=_EPI).values[multi]
            ok = np.isfinite(a) & np.isfinite(e)
            first, second = (e, a) if better == "aleatoric" else (a, e)
            rows.append(sign_finding(
                f"the {better} estimate serves its own task better ({what})",
                f"predictors with >= 2 members ({int(ok.sum())})", "",
                f"predictors where {better} estimate > the other; difference "
                f"{_interval(second[ok] - first[ok])}",
                mean_or_nan(first[ok]), mean_or_nan(second[ok]), second[ok] > first[ok],
                untestable=None))
    if "size_mean" in ds and ds.sizes.get("fraction", 0) >= 2:
        lo, hi = ds["fraction"].values[0], ds["fraction"].values[-1]
        epis = [e for e in ds["estimator"].values
                if str(ds["estimates"].sel(estimator=e).values) == "epistemic"]
        small = ds["size_mean"].sel(fraction=lo, estimator=epis).values.ravel()
        large = ds["size_mean"].sel(fraction=hi, estimator=epis).values.ravel()
        rho = ds["size_spearman"].sel(estimator=epis).values.ravel()
        ok = np.isfinite(small) & np.isfinite(large)
        rows.append(sign_finding(
            "epistemic estimates fall as the training set grows", "(method, epistemic "
            f"estimator) pairs ({int(ok.sum())})", "",
            f"pairs whose mean estimate on the test images at fraction {hi:g} < at {lo:g}; "
            "before/after: no trend (0) and the mean Spearman of the mean estimate with the "
            "fraction",
            0.0, mean_or_nan(rho[ok & np.isfinite(rho)]), large[ok] < small[ok],
            untestable=None))
    return rows


def format_findings(findings: list[Finding]) -> str:
    """The findings as a markdown table (one row each), with the test's level."""
    return findings_table(findings, ("claim", "subject", "statistic"), ALPHA)
