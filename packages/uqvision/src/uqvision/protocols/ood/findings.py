"""OpenOOD v1.5's qualitative findings (Zhang et al. 2023), tested on an ``ood`` result.

:func:`ood_findings` turns a result of :func:`~.score.score_ood` into one row per claim (and
detector or predictor), each with its statistic and a one-sided sign test
(:func:`scipy.stats.binomtest` at probability 1/2):

- **feature-based detectors help far-OOD more than near-OOD** (per feature detector of
  :data:`~.score.FEATURE_DETECTORS` present): over the predictors, the detector's far-AUROC
  gain over MSP exceeds its near-AUROC gain over MSP
  (``far_auroc[d] - far_auroc[msp] > near_auroc[d] - near_auroc[msp]``), ``k`` of ``n``;
- **MSP is a strong baseline on near-OOD**: over the (predictor, other detector) pairs, MSP's
  near AUROC is at least the other detector's; ``before``/``after`` are the other detectors'
  and MSP's mean near AUROC, and the statistic gives MSP's mean rank;
- **UQ methods vs post-hoc detectors at equal cost** (per predictor of several forward passes:
  the deep ensemble, the MC-dropout network): over the OOD sets, the predictor's best member
  detector (:data:`~.score.MEMBER_DETECTORS`) has a higher AUROC than the best post-hoc
  detector (logits or features) of one member network (the ensemble's first member: one
  forward pass per image; for the MC-dropout network itself, whose post-hoc detectors read
  its pass-mean logits: equal cost); the statistic names both costs.

A claim over too few cells for any count to reach ``p < ALPHA`` (``0.5 ** n >= ALPHA``:
``n <= 4``; the UQ claim over the stand-in's one near and one far set has ``n = 2``, whose
smallest p-value is 0.25) is ``untestable with <n> <cells>`` (e.g. ``untestable with 2
sets``), never ``not reproduced``. Predictors share their images, so the cells are not
independent draws: the p-values are a guide, not exact error rates (docs/conventions.md#v-6).
:func:`format_findings` writes the rows as a markdown table.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..findings import ALPHA, Finding, findings_table, mean_or_nan, sign_finding
from .score import FEATURE_DETECTORS, MEMBER_DETECTORS

__all__ = ["ALPHA", "OodFinding", "format_findings", "ood_findings"]

#: The rows of :func:`ood_findings` (its subject: the detector or predictor; no condition).
OodFinding = Finding


def _finding(claim, subject, statistic, before, after, wins, cells) -> Finding:
    return sign_finding(claim, subject, "", statistic, before, after, wins,
                        untestable=f"untestable with {{n}} {cells}")


def ood_findings(result: xr.Dataset) -> list[Finding]:
    """Test OpenOOD v1.5's findings on an ``ood`` result (module docstring).

    Parameters
    ----------
    result : xarray.Dataset
        A result of :func:`~.score.score_ood` with ``near_auroc``, ``far_auroc`` (model,
        detector) and ``auroc`` (model, detector, ood_set), and an ``msp`` detector.

    Returns
    -------
    list of Finding
        The feature-detector rows, the MSP row, then the UQ-vs-post-hoc rows; a claim whose
        detectors or predictors are absent has no row.

    Raises
    ------
    uqmetrics.InputError
        A result without the variables above or without the ``msp`` detector.
    """
    for var in ("near_auroc", "far_auroc", "auroc"):
        if var not in result:
            raise InputError(f"result has no variable {var!r}: not an ood result "
                             "(uqvision score ood)")
    dets = [str(d) for d in result["detector"].values]
    if "msp" not in dets:
        raise InputError(f"result has no msp detector (the baseline); detectors: {dets}")
    near, far = result["near_auroc"], result["far_auroc"]
    rows = []
    for d in [d for d in FEATURE_DETECTORS if d in dets]:
        gn = (near.sel(detector=d) - near.sel(detector="msp")).values
        gf = (far.sel(detector=d) - far.sel(detector="msp")).values
        ok = ~(np.isnan(gn) | np.isnan(gf))
        rows.append(_finding("feature-based detectors help far-OOD more than near-OOD", d,
                             "predictors whose far-AUROC gain over MSP exceeds the near gain",
                             mean_or_nan(gn[ok]), mean_or_nan(gf[ok]), gf[ok] > gn[ok],
                             "predictors"))
    others = [d for d in dets if d != "msp"]
    if others:
        msp = near.sel(detector="msp").values[:, None]
        rest = near.sel(detector=others).values
        ok = ~(np.isnan(rest) | np.isnan(msp))
        full = near.values
        ranks = [1 + int(np.sum(row[~np.isnan(row)] > m)) for row, m in
                 zip(full, msp[:, 0], strict=True) if not np.isnan(m)]
        rows.append(_finding(
            "MSP is a strong baseline on near-OOD", "msp",
            f"(predictor, detector) pairs with MSP's near AUROC >= the other's; MSP's mean "
            f"rank {mean_or_nan(np.asarray(ranks)):.1f} of {len(dets)}",
            mean_or_nan(rest[ok]), mean_or_nan(np.broadcast_to(msp, rest.shape)[ok]),
            np.broadcast_to(msp, rest.shape)[ok] >= rest[ok], "pairs"))
    members_of = json.loads(result.attrs.get("ensemble_members", "{}"))
    uq = [d for d in MEMBER_DETECTORS if d in dets]
    posthoc = [d for d in dets if d not in MEMBER_DETECTORS]
    passes = result.get("forward_passes")
    models = [str(m) for m in result["model"].values]
    if uq and posthoc and passes is not None:
        auroc = result["auroc"]
        for m in models:
            cost = int(passes.sel(model=m))
            if cost < 2:
                continue
            single = members_of.get(m, [m])[0]
            a = auroc.sel(model=m, detector=uq).max("detector", skipna=True).values
            b = auroc.sel(model=single, detector=posthoc).max("detector", skipna=True).values
            ok = ~(np.isnan(a) | np.isnan(b))
            single_cost = int(passes.sel(model=single))
            rows.append(_finding(
                "UQ methods vs post-hoc detectors at equal cost", m,
                f"OOD sets where its best member detector ({cost} forward passes) beats the "
                f"best post-hoc detector of {single} ({single_cost} forward passes)",
                mean_or_nan(b[ok]), mean_or_nan(a[ok]), a[ok] > b[ok], "sets"))
    return rows


def format_findings(findings: list[Finding]) -> str:
    """The findings as a markdown table (one row each), with the test's level."""
    return findings_table(findings, ("claim", "subject", "statistic"), ALPHA)
