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
KINDS = ["single", "single", "ensemble"]
VAN, DROP, ENS = MODELS


def _result(ece: np.ndarray, brier: np.ndarray, clean_ece: np.ndarray, *,
            models=MODELS, kinds=KINDS) -> xr.Dataset:
    """ece, brier: (model, corruption, severity, calibration); clean_ece: (model, calibration).
    Accuracy falls and NLL rises with severity, alike for every model; temperatures 0.9 (the
    first model: sharpens), 1.2 (the second: softens), then 0.8."""
    dims = ("model", "corruption", "severity", "calibration")
    sev = np.arange(1, 6)[None, None, :, None]
    noise = np.random.default_rng(1).random(ece.shape)
    accuracy = np.broadcast_to(0.9 - 0.1 * sev + 0.01 * noise[..., :1], ece.shape).copy()
    nll = 1.0 + 0.2 * sev + 0.01 * noise
    return xr.Dataset(
        {"ece": (dims, ece), "brier": (dims, brier), "accuracy": (dims, accuracy),
         "nll": (dims, nll), "clean_ece": (("model", "calibration"), clean_ece),
         "temperature": ("model", [0.9, 1.2, *[0.8] * (len(models) - 2)])},
        coords={"model": models, "kind": ("model", kinds),
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
    (row,) = [r for r in rows if r.claim == claim and r.subject == predictor
              and r.condition == calibration]
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
    assert [r.subject for r in rows[:6]] == [m for m in MODELS for _ in range(2)]
    # 6 calibration rows; the two temperature claims (1 + 3 predictors); the ensemble against
    # vanilla and MC dropout, MC dropout against vanilla and the ranking, each over accuracy
    # (un-scaled) and NLL, Brier, ECE (x 2 calibrations)
    assert len(rows) == 6 + 1 + 3 + 2 * 7 + 7 + 7
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


def test_temperature_helping_in_distribution_is_a_sign_test_over_rows():
    """The paper's first half: TS lowers the clean ECE. One row over every row of the
    result, (none, temperature) per row; three rows are too few to test."""
    models = [f"net{i}" for i in range(5)] + ["deep_ensemble[5]"]
    shape = (6, len(CORRUPTIONS), len(SEVERITIES), 2)
    none = np.array([0.02, 0.03, 0.04, 0.05, 0.06, 0.07])
    scaled = none + np.array([0.01, 0.01, -0.01, 0.002, 0.01, 0.01])  # helps one row of 6
    ds = _result(np.full(shape, 0.1), np.full(shape, 0.5), np.c_[none, scaled],
                 models=models, kinds=["single"] * 5 + ["ensemble"])
    r = _row(shift_findings(ds), "temperature scaling helps in distribution", "every row (6)",
             "temperature")
    assert (r.k, r.n) == (1, 6)
    assert r.before == pytest.approx(none.mean()) and r.after == pytest.approx(scaled.mean())
    assert r.p_value == pytest.approx(binom.sf(0, 6, 0.5)) and r.verdict == "not reproduced"
    ds["clean_ece"].loc[{"calibration": "temperature"}] = none - 0.005  # helps every row
    ds["clean_ece"].loc[{"model": "net3"}] = np.nan  # a row without a clean ECE: left out
    r = _row(shift_findings(ds), "temperature scaling helps in distribution", "every row (5)",
             "temperature")
    assert (r.k, r.n, r.verdict) == (5, 5, "reproduced") and r.p_value == pytest.approx(1 / 32)


def test_too_few_cells_or_rows_are_untestable(result):
    rows = shift_findings(result)
    r = _row(rows, "temperature scaling helps in distribution", "every row (3)", "temperature")
    assert (r.k, r.n, r.verdict) == (0, 3, "untestable (n = 3)")  # 0.5 ** 3 >= ALPHA
    one = shift_findings(result.isel(corruption=slice(0, 4)))  # 4 corruptions: 1/16 >= ALPHA
    r = _row(one, "calibration worsens with severity", ENS, "none")
    assert (r.k, r.n, r.verdict) == (4, 4, "untestable (n = 4)")
    five = shift_findings(result.isel(corruption=slice(0, 5)))  # 1/32 < ALPHA: testable
    assert _row(five, "calibration worsens with severity", ENS, "none").verdict == "reproduced"


def test_temperature_not_surviving_shift_counts_cells_and_names_the_mechanism(result):
    """The paper's second half, per predictor over every (corruption, severity) cell: the
    temperature-scaled ECE above the un-scaled; the fitted T says which way it moved."""
    rng = np.random.default_rng(2)
    worse = np.ones((len(CORRUPTIONS), len(SEVERITIES)), bool)
    worse.flat[rng.choice(worse.size, 5, replace=False)] = False  # 25 of 30 cells worse
    none = result["ece"].sel(model=VAN, calibration="none").values
    result["ece"].loc[{"model": VAN, "calibration": "temperature"}] = \
        none + np.where(worse, 0.01, -0.01)
    result["ece"].loc[{"model": VAN, "corruption": "c1", "severity": 2}] = np.nan  # left out
    rows = shift_findings(result)
    r = _row(rows, "temperature scaling does not survive shift", VAN, "temperature")
    k = int(np.delete(worse.ravel(), CORRUPTIONS.index("c1") * 5 + 1).sum())
    assert (r.k, r.n) == (k, 29)
    assert r.p_value == pytest.approx(binom.sf(k - 1, 29, 0.5)) and r.verdict == "reproduced"
    a = result["ece"].sel(model=VAN, calibration="none").values
    b = result["ece"].sel(model=VAN, calibration="temperature").values
    assert r.before == pytest.approx(np.nanmean(a)) and r.after == pytest.approx(np.nanmean(b))
    assert r.statistic.endswith("(fitted T = 0.9: sharpens)")
    assert _row(rows, "temperature scaling does not survive shift", DROP,
                "temperature").statistic.endswith("(fitted T = 1.2: softens)")
    assert "fitted T" not in _row(shift_findings(result.drop_vars("temperature")),
                                  "temperature scaling does not survive shift", VAN,
                                  "temperature").statistic


def test_dropout_ranking_is_the_half_with_the_larger_p(result):
    """MC dropout between vanilla and the ensemble: both one-sided halves over the cells of
    severities 3..5, the row repeating the weaker (an intersection-union test)."""
    upper = {"severity": [3, 4, 5]}
    acc = result["accuracy"]
    # accuracy (higher is better): dropout above vanilla in all 18 cells, the ensemble above
    # dropout in 12 of 18
    acc.loc[{"model": DROP, **upper}] = acc.sel(model=VAN, **upper) + 0.05
    ens = acc.sel(model=DROP, **upper).values + 0.02
    ens[:2] -= 0.04  # c0, c1: below dropout (2 corruptions x 3 severities x 2 calibrations)
    acc.loc[{"model": ENS, **upper}] = ens
    # NLL (lower is better): dropout below vanilla in 10 of 18 cells, the ensemble everywhere
    # below dropout
    nll = result["nll"]
    above = np.zeros((len(CORRUPTIONS), 3), bool)
    above.flat[10:] = True  # 8 of the 18 cells
    drop = nll.sel(model=VAN, **upper).values + np.where(above, 0.05, -0.05)[..., None]
    nll.loc[{"model": DROP, **upper}] = drop
    nll.loc[{"model": ENS, **upper}] = drop - 0.01
    rows = shift_findings(result, vanilla=VAN)
    claim = f"MC dropout ranks between {VAN} and {ENS}"
    half = _row(rows, f"MC dropout beats {VAN} (accuracy)", DROP, "none")
    assert (half.k, half.n, half.verdict) == (18, 18, "reproduced")
    other = _row(rows, f"ensemble beats {DROP} (accuracy)", ENS, "none")
    assert (other.k, other.n) == (12, 18)
    r = _row(rows, f"{claim} (accuracy)", DROP, "none")
    assert (r.k, r.n, r.p_value, r.before, r.after) == (
        other.k, other.n, other.p_value, other.before, other.after)
    assert r.p_value == pytest.approx(binom.sf(11, 18, 0.5)) and r.verdict == "not reproduced"
    assert f"ensemble beats {DROP}" in r.statistic and "higher accuracy" in r.statistic
    assert not [x for x in rows if x.claim.endswith("(accuracy)") and x.condition != "none"]
    for cal in ("none", "temperature"):
        half = _row(rows, f"MC dropout beats {VAN} (nll)", DROP, cal)
        assert (half.k, half.n) == (10, 18)
        assert _row(rows, f"ensemble beats {DROP} (nll)", ENS, cal).k == 18
        r = _row(rows, f"{claim} (nll)", DROP, cal)
        assert (r.k, r.n, r.verdict) == (10, 18, "not reproduced")
        assert r.p_value == pytest.approx(binom.sf(9, 18, 0.5))
        assert f"MC dropout beats {VAN}" in r.statistic
    # both halves hold: the ranking is reproduced, at the larger of the two p-values
    nll.loc[{"model": DROP, **upper}] = nll.sel(model=VAN, **upper) - 0.05
    nll.loc[{"model": ENS, **upper}] = nll.sel(model=DROP, **upper) - 0.01
    r = _row(shift_findings(result, vanilla=VAN), f"{claim} (nll)", DROP, "none")
    assert (r.k, r.n, r.verdict) == (18, 18, "reproduced")
    assert r.p_value == pytest.approx(0.5 ** 18)
