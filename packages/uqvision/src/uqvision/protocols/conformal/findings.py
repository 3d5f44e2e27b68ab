"""Angelopoulos et al. (2021)'s claims about conformal sets, tested on a ``conformal`` result.

:func:`conformal_findings` turns a result of :func:`~.score.score_conformal` into one row per
claim and calibration (and per severity under shift), each a one-sided sign test over cells
(:func:`~uqvision.protocols.findings.sign_finding`):

- **RAPS sets smaller than APS at equal coverage** (per alpha; cells: models): RAPS's mean set
  size is below APS's, and RAPS does not buy it with lower coverage: its coverage is at least
  APS's minus two standard errors of the difference (``sqrt(std_aps**2 + std_raps**2) /
  sqrt(trials)``, the trials' standard deviations; it ignores the positive correlation of the
  two methods on shared splits, so it is conservative towards accepting equality). A cell
  where RAPS covers less counts against the claim. Coverage against the target ``1 - alpha``
  itself is not part of this claim: both methods share every split, so a split that
  under-covers does so for both (the marginal guarantee holds over splits, not per split).
- **Naive under-covers** (cells: model x alpha): the coverage of the ``naive`` sets, the
  official code's (randomized, empty sets allowed), is below ``1 - alpha``. The paper's claim
  is the ``platt`` row: its Naive runs on a softmax tempered on each trial's calibration draw,
  and under-covers (0.884-0.896 at 0.1 in its Table 1) because a softmax calibrated on
  average is still over-confident on the hard images. On a softmax that is calibrated for
  every image the randomized Naive covers exactly ``1 - alpha`` on average; an under-confident
  one (the ``none`` row of small networks, fitted temperatures below 1) makes Naive
  over-cover. The deterministic variant (``naive_deterministic``: the last class always kept)
  covers more than Naive at every level, which is not the paper's baseline and is not
  tested.
- **coverage falls under shift** (per severity; cells: model x conformal method x corruption x
  alpha): the coverage on the corrupted images, the sets calibrated on clean images, is below
  ``1 - alpha``; and the same per natural shift set.

A tie counts against the claim. A claim over too few cells for any count to reach
``p < ALPHA`` (``0.5 ** n >= ALPHA``: ``n <= 4``, e.g. RAPS against APS on four models) is
``untestable``. The cells share their images, so the p-values are a guide, not exact error rates
(docs/conventions.md#v-7). :func:`format_findings` writes the rows as a markdown table, and,
given the result, :func:`mondrian_notes`: why Mondrian APS sets are large where a class has few
calibration images.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..findings import ALPHA, Finding, findings_table, mean_or_nan, sign_finding

__all__ = ["ALPHA", "SHIFT_METHODS", "ConformalFinding", "conformal_findings",
           "format_findings", "mondrian_notes"]

#: The methods whose coverage under shift is tested (the calibrated ones; Naive has no
#: guarantee to lose).
SHIFT_METHODS = ("thr", "aps", "raps", "aps_mondrian")


#: The rows of :func:`conformal_findings` (its subject: what the cells are, ``all models``,
#: ``alpha <a>``, ``severity <s>`` or ``shift set <name>``; its condition: the calibration).
#: Their verdict is ``reproduced``, ``not reproduced``, or ``untestable (n = <n>)`` where even
#: ``n`` of ``n`` cells could not reach ``ALPHA`` (``n <= 4``: a claim over four models).
ConformalFinding = Finding


def _finding(claim, subject, calibration, statistic, before, after, wins) -> Finding:
    return sign_finding(claim, subject, calibration, statistic, before, after, wins)


def _target(result: xr.DataArray) -> xr.DataArray:
    """``1 - alpha`` broadcast like ``result``."""
    return (1.0 - result["alpha"]).broadcast_like(result)


def _coverage_falls(c: xr.DataArray, subject: str, calibration: str, cells: str) -> Finding:
    """``coverage falls under shift`` over the ``cells`` of ``c`` (the coverage, below
    ``1 - alpha`` where the claim holds)."""
    target, ok = _target(c).values, ~np.isnan(c.values)
    return _finding("coverage falls under shift", subject, calibration,
                    f"{cells} cells with coverage < 1-alpha",
                    mean_or_nan(target[ok]), mean_or_nan(c.values[ok]), (c.values < target)[ok])


def conformal_findings(result: xr.Dataset) -> list[Finding]:
    """Test the paper's claims on a ``conformal`` result (module docstring).

    Parameters
    ----------
    result : xarray.Dataset
        A result of :func:`~.score.score_conformal`: ``coverage``, ``coverage_std``,
        ``mean_set_size`` (model, method, alpha, calibration), attr ``trials``; with corrupted
        members ``shift_coverage`` (model, method, alpha, corruption, severity, calibration),
        with natural shift sets ``set_coverage``.

    Returns
    -------
    list of Finding
        Per calibration: the RAPS claim, the Naive claim, then the shift claim per severity
        and per natural shift set (none without shifted data).

    Raises
    ------
    uqmetrics.InputError
        A result without the variables above, or without the methods they compare.
    """
    for var in ("coverage", "coverage_std", "mean_set_size"):
        if var not in result:
            raise InputError(f"result has no variable {var!r}: not a conformal result "
                             "(uqvision score conformal)")
    methods = [str(m) for m in result["method"].values]
    lack = [m for m in ("naive", "aps", "raps") if m not in methods]
    if lack:
        raise InputError(f"result has no method(s) {lack}; its methods: {methods}")
    trials = int(result.attrs.get("trials", 1))
    rows = []
    for cal in [str(c) for c in result["calibration"].values]:
        at = result.sel(calibration=cal)
        cov, size = at["coverage"], at["mean_set_size"]
        std = at["coverage_std"]
        se_diff = np.sqrt(std.sel({"method": "aps"}) ** 2
                          + std.sel({"method": "raps"}) ** 2) / np.sqrt(trials)
        covered = cov.sel({"method": "raps"}) >= cov.sel({"method": "aps"}) - 2.0 * se_diff
        smaller = size.sel({"method": "raps"}) < size.sel({"method": "aps"})
        ok = ~(np.isnan(size.sel({"method": "raps"})) | np.isnan(size.sel({"method": "aps"})))
        for alpha in result["alpha"].values.tolist():
            at_alpha = {"alpha": alpha}
            keep = ok.sel(at_alpha).values
            rows.append(_finding(
                "RAPS smaller than APS at equal coverage", f"alpha {alpha:g}", cal,
                "models with RAPS mean size < APS's at coverage >= APS's - 2SE",
                mean_or_nan(size.sel({"method": "aps", **at_alpha}).values[keep]),
                mean_or_nan(size.sel({"method": "raps", **at_alpha}).values[keep]),
                (smaller & covered).sel(at_alpha).values[keep]))
        naive = cov.sel({"method": "naive"})
        target = _target(naive)
        ok = ~np.isnan(naive.values)
        rows.append(_finding(
            "Naive under-covers", "all models", cal,
            "model x alpha cells with Naive coverage < 1-alpha", mean_or_nan(target.values[ok]),
            mean_or_nan(naive.values[ok]), (naive < target).values[ok]))
        shifted = [m for m in SHIFT_METHODS if m in methods]
        if "shift_coverage" in result and result.sizes.get("severity", 0):
            shift = at["shift_coverage"].sel({"method": shifted})
            for sev in result["severity"].values.tolist():
                rows.append(_coverage_falls(shift.sel(severity=sev), f"severity {sev}", cal,
                                            "model x method x corruption x alpha"))
        if "set_coverage" in result and result.sizes.get("shift_set", 0):
            sets = at["set_coverage"].sel({"method": shifted})
            for name in result["shift_set"].values.tolist():
                rows.append(_coverage_falls(sets.sel(shift_set=name), f"shift set {name}", cal,
                                            "model x method x alpha"))
    return rows


def mondrian_notes(result: xr.Dataset) -> list[str]:
    """Why the class-conditional (Mondrian) APS sets of a ``conformal`` result are as large as
    they are, per level, from the file.

    Mondrian APS holds out no tuning split (only RAPS does): each class's threshold is the
    conformal quantile of that class's images among the ``n_cal`` of a trial's draw, about
    ``n_cal / C`` of them. A class with fewer than ``min_n_cal`` images (S.8:
    ``ceil((n + 1)(1 - alpha)) > n``) gets an infinite threshold and is in EVERY set of that
    trial: ``short_calibration`` is the fraction of (trial, class) draws where that happened,
    and about that fraction of the ``C`` classes is in each set on top of the class's own.

    Parameters
    ----------
    result : xarray.Dataset
        A result of :func:`~.score.score_conformal` with ``short_calibration``, ``min_n_cal``,
        ``mean_set_size`` and ``n_cal``.

    Returns
    -------
    list of str
        One line per level (none without ``aps_mondrian`` or those variables): the images per
        class, the share of (trial, class) draws with too few, the classes that share puts in
        every set, and the un-scaled mean set size over the predictors.
    """
    need = ("short_calibration", "min_n_cal", "mean_set_size", "n_cal")
    if any(v not in result for v in need) or "aps_mondrian" not in [
            str(m) for m in result["method"].values]:
        return []
    mondrian = {"method": "aps_mondrian"}
    c = result.sizes["class"] if "class" in result.dims else None
    n_cal = float(np.mean(result["n_cal"].values))
    lines = []
    for alpha in result["alpha"].values.tolist():
        at = {**mondrian, "alpha": alpha}
        short = float(result["short_calibration"].sel(at).mean())
        need_n = int(result["min_n_cal"].sel(at))
        size = result["mean_set_size"].sel({**at, "calibration": "none"}).values
        per_class = f"about {n_cal / c:.1f} images per class" if c else f"{n_cal:g} images"
        full = f", {short * c:.1f} of the {c} classes per trial" if c else ""
        lines.append(
            f"- aps_mondrian at alpha {alpha:g}: no tuning split is held out, so each class "
            f"calibrates on its own images among the n_cal = {n_cal:g} of a trial's draw, "
            f"{per_class}; {100 * short:.1f}% of the (trial, class) draws hold fewer than "
            f"{need_n}: the class's threshold is then infinite and the class in every "
            f"set{full}; mean set size {float(np.nanmean(size)):.2f} (un-scaled, over the "
            "predictors).")
    return lines


def format_findings(findings: list[Finding], result: xr.Dataset | None = None) -> str:
    """The findings as a markdown table (one row each), with the test's level; given the
    ``result`` they were computed from, then the lines of :func:`mondrian_notes`."""
    table = findings_table(findings, ("claim", "subject", ("condition", "calibration"),
                                      "statistic"), ALPHA)
    notes = mondrian_notes(result) if result is not None else []
    return table + ("\nMondrian (class-conditional) APS:\n\n" + "\n".join(notes) + "\n"
                    if notes else "")
