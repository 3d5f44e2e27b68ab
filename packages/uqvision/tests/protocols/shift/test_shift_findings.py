"""The shift findings (Ovadia et al. 2019's claims as sign tests), checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.stats import binom
from uqmetrics import InputError

from uqvision.protocols.shift.findings import ALPHA, format_findings, shift_findings

CORRUPTIONS = [f"c{i}" for i in range(6)]
SEVERITIES = [1, 2, 3, 4, 5]
MODELS = ["net@vanilla", "net@mc_dropout_s100", "deep_ensemble[3]"]


def _result(ece: np.ndarray, brier: np.ndarray, clean_ece: np.ndarray) -> xr.Dataset:
    """ece, brier: (model, corruption, severity, calibration); clean_ece: (model, calibration)."""
    dims = ("model", "corruption", "severity", "calibration")
    return xr.Dataset(
        {"ece": (dims, ece), "brier": (dims, brier),
         "clean_ece": (("model", "calibration"), clean_ece)},
        coords={"model": MODELS, "kind": ("model", ["single", "single", "ensemble"]),
                "corruption": CORRUPTIONS, "severity": SEVERITIES,
                "calibration": ["none", "temperature"]})


@pytest.fixture
def result() -> xr.Dataset:
    rng = np.random.default_rng(0)
    shape = (3, len(CORRUPTIONS), len(SEVERITIES), 2)
    # ECE grows with severity for every model; the ensemble's Brier is lower everywhere
    ece = 0.05 + 0.02 * np.arange(1, 6)[None, None, :, None] + 0.001 * rng.random(shape)
    brier = 0.5 + 0.05 * np.arange(1, 6)[None, None, :, None] + 0.01 * rng.random(shape)
    brier[2] -= 0.1
    return _result(ece, brier, np.full((3, 2), 0.04))


def _row(rows, claim, predictor, calibration):
    (row,) = [r for r in rows if r.claim == claim and r.predictor == predictor
              and r.calibration == calibration]
    return row


def test_calibration_claim_counts_corruptions_above_the_clean_ece(result):
    # one corruption of the vanilla network is better calibrated at severity 5 than clean
    result["ece"].loc[{"model": "net@vanilla", "corruption": "c2", "severity": 5,
                           "calibration": "none"}] = 0.01
    rows = shift_findings(result, vanilla="net@vanilla")
    r = _row(rows, "calibration worsens with severity", "net@vanilla", "none")
    top = result["ece"].sel(model="net@vanilla", calibration="none", severity=5).values
    assert (r.k, r.n) == (5, 6)
    assert r.before == pytest.approx(0.04) and r.after == pytest.approx(top.mean())
    assert r.p_value == pytest.approx(binom.sf(4, 6, 0.5))  # P(K >= 5), K ~ Bin(6, 1/2)
    assert r.verdict == ("reproduced" if r.p_value < ALPHA else "not reproduced")
    assert r.verdict == "not reproduced"  # 7/64 = 0.109
    r = _row(rows, "calibration worsens with severity", "deep_ensemble[3]", "temperature")
    assert (r.k, r.n, r.verdict) == (6, 6, "reproduced")
    assert r.p_value == pytest.approx(1 / 64)


def test_ensemble_claim_counts_the_upper_severity_cells(result):
    # the vanilla network beats the ensemble in 10 of the 18 cells of severities 3..5 -> the
    # ensemble wins 8
    b = result["brier"]
    for c in CORRUPTIONS[:4]:
        for s in (3, 4, 5)[: 3 if c != "c3" else 1]:
            b.loc[{"model": "net@vanilla", "corruption": c, "severity": s, "calibration": "none"}] = 0.0
    rows = shift_findings(result, vanilla="net@vanilla", min_severity=3)
    r = _row(rows, "ensemble beats net@vanilla (brier)", "deep_ensemble[3]", "none")
    upper = result["severity"].values >= 3
    a = b.sel(model="deep_ensemble[3]", calibration="none").values[:, upper]
    o = b.sel(model="net@vanilla", calibration="none").values[:, upper]
    assert (r.k, r.n) == (int((a < o).sum()), 18) == (8, 18)
    assert r.before == pytest.approx(o.mean()) and r.after == pytest.approx(a.mean())
    assert r.p_value == pytest.approx(binom.sf(7, 18, 0.5))
    assert r.verdict == "not reproduced"
    r = _row(rows, "ensemble beats net@mc_dropout_s100 (brier)", "deep_ensemble[3]", "none")
    assert (r.k, r.n, r.verdict) == (18, 18, "reproduced")


def test_missing_cells_are_left_out_of_the_counts(result):
    result["ece"].loc[{"model": "deep_ensemble[3]", "corruption": "c0"}] = np.nan
    rows = shift_findings(result)
    assert _row(rows, "calibration worsens with severity", "deep_ensemble[3]", "none").n == 5
    assert _row(rows, "ensemble beats net@vanilla (ece)", "deep_ensemble[3]", "none").n == 15


def test_rows_and_table(result):
    rows = shift_findings(result)  # vanilla: the first single model
    assert [r.predictor for r in rows[:6]] == [m for m in MODELS for _ in range(2)]
    assert len(rows) == 6 + 2 * 2 * 2  # ensemble vs vanilla and MC dropout, 2 metrics x 2
    table = format_findings(rows)
    assert table.count("\n| ") == len(rows) + 1  # a header and one line per row
    assert f"level {ALPHA}" in table


def test_bad_results_are_refused(result):
    with pytest.raises(InputError, match="no variable 'brier'"):
        shift_findings(result.drop_vars("brier"))
    with pytest.raises(InputError, match="vanilla 'zz'"):
        shift_findings(result, vanilla="zz")
    with pytest.raises(InputError, match="no corrupted members"):
        shift_findings(result.isel(severity=[]))
