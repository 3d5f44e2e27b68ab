"""The real-data study (docs/conventions.md#r-9): ``uqreg real`` and ``uqreg reproduce real`` on
diabetes at smoke size, and isotonic recalibration against an analytic miscalibration."""

from __future__ import annotations

import numpy as np
import pytest
import uqmetrics
from scipy.special import ndtr, ndtri

from uqreg.cli import main
from uqreg.real import CALIBRATION_SCORES, RECALIBRATIONS, paired_sign_test, recalibrated
from uqreg.study import SCORE_METRICS

TINY = ["--n-splits", "2", "--members", "2", "--epochs", "3", "--mc-samples", "3", "--quiet"]


def test_real_cli_smoke_every_score_before_and_after(tmp_path, capsys):
    out = tmp_path / "real"
    methods = "blr,ens,ens+cp_abs,ens+cqr,bd+mv"
    conformal = ["ens+cp_abs", "ens+cqr"]  # calibrated on the calibration part: not recalibrated
    assert main(["real", "--dataset", "diabetes", "--methods", methods, "--out", str(out), "--no-plots", *TINY]) == 0
    ds = uqmetrics.read_dataset(out / "study.nc")
    assert list(ds.method.values) == methods.split(",") and list(ds.recal.values) == list(RECALIBRATIONS)
    assert ds.sizes["split"] == 2 and int(ds.n_test[0]) == 44 and int(ds.n_cal[0]) == 80
    own = [m for m in ds.method.values if m not in conformal]
    for k in SCORE_METRICS:
        s = ds[f"score_{k}"]
        assert np.all(np.isfinite(s.sel(recal="none").values)), k
        assert np.all(np.isfinite(s.sel({"method": own, "recal": "sigma_scaling"}).values)), k
        iso = s.sel({"method": own, "recal": "isotonic"}).values
        assert np.all(np.isfinite(iso)) if k in CALIBRATION_SCORES else np.all(np.isnan(iso)), k
        assert np.all(np.isnan(s.sel({"method": conformal, "recal": ["isotonic", "sigma_scaling"]}).values))
        assert np.all(np.isfinite(ds[f"score_{k}_mean"].sel(recal="none").values))
    assert ds.attrs["sigma_scaling_criterion"] == "nll"  # S.6b: the NLL-optimal factor (before: MACE, unrecorded)
    cov = ds.coverage.sel({"method": own})
    assert np.all((cov >= 0) & (cov <= 1))
    assert np.all(np.isfinite(ds.sigma_hat.sel({"method": ["blr", "ens"]}).values))
    assert np.all(np.isnan(ds.sigma_hat.sel({"method": [*conformal, "bd+mv"]}).values))
    # scores are in the target's units: the predictive means lie in the range of the targets
    assert 25 < float(ds.prediction.mean()) < 346
    printed = capsys.readouterr().out
    assert "| blr | isotonic |" in printed and "paired sign test" in printed
    # an existing result is refused without --overwrite, one line, exit code 2
    assert main(["real", "--methods", "blr", "--out", str(out), "--no-plots", *TINY]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err


def test_real_cli_bad_input_named(tmp_path, capsys):
    folder = tmp_path / "uci"
    folder.mkdir()
    (folder / "data.txt").write_text("1 2\n3 x\n5 6\n")
    assert main(["real", "--data", str(folder), "--out", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("uqreg real: error: --data") and "data.txt line 2: 'x' is not a number" in err
    assert main(["real", "--cal-fraction", "1.5", "--out", str(tmp_path / "o"), *TINY]) == 2
    assert "--cal-fraction must be a number in (0, 1), got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_real_help_states_its_own_epochs_default(capsys):
    """``uqreg real --help`` gives the real study's default of --epochs, 100 (before, the
    study's "default 300·complexity": real data has no complexity)."""
    from uqreg.real import REAL_TRAIN

    with pytest.raises(SystemExit):
        main(["real", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--epochs EPOCHS epochs (default {REAL_TRAIN.epochs})" in text and "300·complexity" not in text


def test_real_refuses_a_bad_split_before_training_any(tmp_path, capsys, monkeypatch):
    """A split too small for --cal-fraction is refused before any split trains (before, split 0
    trained first, and a UCI folder's last split failed the run after all the others)."""
    import uqreg.real

    folder = tmp_path / "uci"
    rng = np.random.default_rng(0)
    folder.mkdir()
    np.savetxt(folder / "data.txt", rng.normal(size=(15, 3)))
    (folder / "index_features.txt").write_text("0\n1\n")
    (folder / "index_target.txt").write_text("2\n")
    (folder / "index_train_0.txt").write_text("\n".join(map(str, range(4, 15))))
    (folder / "index_test_0.txt").write_text("0\n1\n2\n3\n")
    (folder / "index_train_1.txt").write_text("5\n6\n")  # 2 rows: 0 calibration rows at 0.2
    (folder / "index_test_1.txt").write_text("0\n")
    trained = []
    monkeypatch.setattr(uqreg.real, "run_split", lambda *a, **k: trained.append(a) or {})
    assert main(["real", "--data", str(folder), "--methods", "blr", "--out", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert "leaves 0 calibration and 2 fit rows" in err and "'standard_1'" in err
    assert trained == [] and not (tmp_path / "o").exists()


def test_findings_do_not_call_a_few_targets_all_covered_over_coverage():
    """44 of 44 held-out targets covered by a 95 % interval is what 0.95**44 = 0.10 of the
    calibrated methods show: no claim (before, the binomial s.e. at the observed coverage 1 was
    0 and the finding read "over-covers"); 880 of 880 (0.95**880 ~ 1e-20) is over-covering."""
    import xarray as xr

    from uqreg.real import findings

    for n_splits, verdict in ((1, "covers within 2 s.e. of 0.95"), (20, "over-covers 0.95")):
        msr = ("method", "split", "recal")
        ds = xr.Dataset({"coverage": (msr, np.ones((1, n_splits, 3))),
                         "n_test": (("split",), np.full(n_splits, 44))},
                        coords={"method": ["ens+cp_abs"], "recal": list(RECALIBRATIONS)}, attrs={"alpha": 0.05})
        for name in ("mace", "nll", "crps"):
            ds[f"score_{name}"] = (msr, np.full((1, n_splits, 3), np.nan))
        ds["coverage_mean"] = ds.coverage.mean("split")
        ds["coverage_se"] = ds.coverage.std("split", ddof=1) / np.sqrt(n_splits) if n_splits > 1 \
            else xr.full_like(ds.coverage_mean, np.nan)
        assert verdict in findings(ds)[0][1], (n_splits, findings(ds))


def test_isotonic_recalibration_lowers_mace_beyond_sampling_error():
    """N(0, 1) targets under a predictive 3× too wide. Before: the observed proportion of the
    central p interval is 2Φ(3 Φ⁻¹(1/2 + p/2)) − 1, MACE its mean distance to p (analytic). An
    empirical proportion is off by at most 2ε (ε the DKW bound at failure probability 10⁻⁶ on n
    points), so the measured MACE lies within 2ε of the analytic one and a recalibrated one that
    is not better would be at least the analytic value − 2ε; isotonic recalibration and
    σ-scaling bring it below that by more than the sampling error of both sides (6ε)."""
    n = 20000
    rng = np.random.default_rng(12)
    y_cal, y = rng.standard_normal(n), rng.standard_normal(n)
    zeros, wide = np.zeros(n), np.full(n, 3.0)
    res = recalibrated(y_cal, zeros, wide, y, zeros, wide)
    p = np.linspace(0, 1, 100)
    analytic = float(np.mean(np.abs(2 * ndtr(3 * ndtri(0.5 + p / 2)) - 1 - p)))
    eps = np.sqrt(np.log(2 / 1e-6) / (2 * n))
    assert abs(res["scores"]["none"]["mace"] - analytic) <= 2 * eps
    assert analytic - 6 * eps > 0.15  # the claim below is not empty
    for rc in ("isotonic", "sigma_scaling"):
        assert res["scores"][rc]["mace"] < analytic - 6 * eps, rc
    # 4 SE on each of the three checks below: 3 × 6.3e-5 two-sided normal tails < 2e-4.
    # σ-scaling's factor (criterion "nll") is sqrt(mean(y_cal²))/3 with y_cal ~ N(0, 1): mean(y²)
    # has variance 2/n, so by the delta method the factor's SE is (1/3)·(1/2)·sqrt(2/n) =
    # 1/(3 sqrt(2n)) = 0.00167 (measured over 2000 seeds: 0.00167)
    assert res["sigma_scaling_factor"] == pytest.approx(1 / 3, abs=4 / (3 * np.sqrt(2 * n)))
    # the 95 % interval: before it covers 2Φ(3·1.96) − 1 ≈ 1; after, p = 0.95 within 4 SE, the
    # SE from both parts: the test part's binomial p(1 − p)/n plus the calibration part's fit.
    # Isotonic: the level R(p) puts a p proportion of the calibration part inside the interval,
    # whose true content then has variance p(1 − p)/n too: SE sqrt(2p(1 − p)/n) = 0.00218.
    # σ-scaling: the coverage 2Φ(z f/f₀) − 1 moves by 2zφ(z) per unit relative error of the
    # factor, of variance 1/(2n): SE sqrt((p(1 − p) + 2(zφ(z))²)/n) = 0.00192.
    # (Measured over 2000 seeds: 0.00215 and 0.00189.)
    assert res["coverage"]["none"] > 0.99
    p_cov, z = 0.95, ndtri(0.975)
    phi_z = np.exp(-z**2 / 2) / np.sqrt(2 * np.pi)
    se_cov = {"isotonic": np.sqrt(2 * p_cov * (1 - p_cov) / n),
              "sigma_scaling": np.sqrt((p_cov * (1 - p_cov) + 2 * (z * phi_z) ** 2) / n)}
    for rc in ("isotonic", "sigma_scaling"):
        assert abs(res["coverage"][rc] - p_cov) <= 4 * se_cov[rc], (rc, res["coverage"][rc])


def test_recalibrated_coverage_is_strict_and_sigma_scaling_nll_optimal():
    """Every coverage of :func:`recalibrated` is uqmetrics' one coverage: ``|y − mean| <
    half-width``, strict (CONVENTIONS["coverage"]), so a target exactly on its band's edge is not
    covered (before: ``<=``, covered). The calibration targets ±1 under N(0, 1) make the
    NLL-optimal σ-scaling factor exactly sqrt(mean y²) = 1 (S.6b; before: the MACE minimiser),
    so the σ-scaled band is the unscaled one, ±z. Test targets: z (on the 95 % band's edge), −z,
    h (on the edge of the isotonic band [lo, h], h − 0 its half-width) and three zeros."""
    from uqmetrics.metrics.regression import IsotonicRecalibrator

    z = float(ndtri(0.975))
    y_cal = np.tile([1.0, -1.0], 40)
    zero_cal, one_cal = np.zeros(80), np.ones(80)
    _, hi = IsotonicRecalibrator().fit(y_cal, zero_cal, one_cal).interval(np.zeros(1), np.ones(1), 0.95)
    h = float(hi[0])
    assert 0 < h < z  # the isotonic band is narrower: h is covered by the ±z bands
    y = np.array([z, -z, h, 0.0, 0.0, 0.0])
    res = recalibrated(y_cal, zero_cal, one_cal, y, np.zeros(6), np.ones(6), alpha=0.05)
    assert res["sigma_scaling_criterion"] == "nll" and res["sigma_scaling_factor"] == 1.0
    assert res["coverage"] == {"none": 4 / 6, "isotonic": 3 / 6, "sigma_scaling": 4 / 6}


def test_coverage_of_bands_that_are_not_finite():
    """The coverage of a band that is NaN (a diverged network) is 0, of an empty one (crossed
    bounds, negative half-width) 0, of the whole line (infinite half-width: a conformal quantile
    beyond its calibration rank) 1; finite bands are strict."""
    from uqreg.real import _coverage

    y = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    mean = np.array([0.0, np.nan, 2.0, 3.0, 4.0])
    half = np.array([0.5, 1.0, -1.0, np.inf, 0.0])
    assert _coverage(y, mean, half) == 2 / 5
    assert _coverage([1.0, 1.5], [0.0, 0.0], [1.0, 2.0]) == 0.5  # 1 on the edge of ±1: not covered


def test_paired_sign_test():
    k, n, p = paired_sign_test([3, 3, 3, 3, 3, np.nan, 1], [1, 1, 1, 1, 1, 0, 1])
    assert (k, n) == (5, 5) and p == pytest.approx(2 * 0.5**5)
    assert np.isnan(paired_sign_test([1.0], [1.0])[2])


def test_reproduce_real_smoke(tmp_path, capsys):
    out = tmp_path / "repro"
    assert main(["reproduce", "real", "--scale", "smoke", "--out", str(out), "--quiet"]) == 0
    for kind in ("standard", "gap"):
        ds = uqmetrics.read_dataset(out / "real" / f"diabetes_{kind}" / "study.nc")
        assert ds.attrs["split_kind"] == kind and ds.sizes["split"] == 2
        assert np.all(np.isfinite(ds.score_crps.sel(recal="none").values))
        assert (out / "real" / "figures" / f"real_diabetes_{kind}_calibration.png").stat().st_size > 0
    text = (out / "real" / "findings.md").read_text()
    assert "## gap splits (2)" in text and "paired sign test" in text and "coverage of held-out targets" in text
    # the same --out at another scale: the smoke studies are neither reused as cpu's nor replaced
    capsys.readouterr()
    assert main(["reproduce", "real", "--scale", "cpu", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--scale cpu: " in err and "diabetes_standard/study.nc holds a study computed at scale 'smoke'" in err
    assert "pass --overwrite to replace it by one at scale 'cpu'" in err
    assert uqmetrics.read_dataset(out / "real" / "diabetes_gap" / "study.nc").attrs["reproduce_scale"] == "smoke"


def test_reproduce_real_overwrite_and_atomic_findings(tmp_path, monkeypatch):
    """With ``overwrite`` a study of another scale is replaced by the scale asked (without, it is
    refused: :func:`test_reproduce_real_smoke`); ``findings.md`` is written atomically, so a write
    that fails midway (here a character UTF-8 cannot encode) leaves the previous one intact and
    no temporary file (before: ``Path.write_text`` had truncated it)."""
    from dataclasses import replace

    from uqreg import real

    smoke = real.SCALES.lookup("smoke")
    tiny = replace(smoke, name="tiny", n_splits={"standard": 1, "gap": 1}, methods=("blr", "ens"),
                   train=replace(smoke.train, members=2, epochs=2))
    monkeypatch.setitem(real.SCALES, "tiny", tiny)
    out = tmp_path / "real"
    real.reproduce_real(out, scale="smoke", progress=False)
    with pytest.raises(uqmetrics.InputError, match="holds a study computed at scale 'smoke'; pass --overwrite"):
        real.reproduce_real(out, scale="tiny", progress=False)
    real.reproduce_real(out, scale="tiny", progress=False, overwrite=True)
    for kind in ("standard", "gap"):
        ds = uqmetrics.read_dataset(out / f"diabetes_{kind}" / "study.nc")
        assert ds.attrs["reproduce_scale"] == "tiny" and ds.sizes["split"] == 1
        assert list(ds.method.values) == ["blr", "ens"]
    before = (out / "findings.md").read_text()
    monkeypatch.setattr(real, "score_table", lambda ds: "\udcff")  # unencodable: the write fails midway
    with pytest.raises(UnicodeEncodeError):
        real.reproduce_real(out, scale="tiny", progress=False)  # the studies are reused
    assert (out / "findings.md").read_text() == before
    assert not list(out.glob(".findings.md.*"))


def test_reproduce_real_refuses_a_study_of_another_configuration_or_criterion(tmp_path, monkeypatch):
    """A study of the scale asked, but computed with another sigma-scaling criterion (a study of
    before the NLL-optimal default, which recorded none: the 'mace' factor) or another training
    configuration of the scale, is neither reused nor replaced without ``overwrite``: an error
    naming the file and what differs. Before, every study recording the scale was reused."""
    from dataclasses import replace

    from uqreg import real

    smoke = real.SCALES.lookup("smoke")
    tiny = replace(smoke, name="tiny", n_splits={"standard": 1}, methods=("blr", "ens"),
                   train=replace(smoke.train, members=2, epochs=2))
    monkeypatch.setitem(real.SCALES, "tiny", tiny)
    out = tmp_path / "real"
    real.reproduce_real(out, scale="tiny", progress=False)
    path = out / "diabetes_standard" / "study.nc"
    ds = uqmetrics.read_dataset(path).load()
    del ds.attrs["sigma_scaling_criterion"]  # as a study of before the criterion was recorded
    uqmetrics.write_dataset(ds, path, overwrite=True)
    with pytest.raises(uqmetrics.InputError, match=r"study.nc holds a study computed at scale 'tiny' from another "
                       r"configuration than this run's \(sigma_scaling_criterion \(not recorded\) \(asked \"nll\"\)\)"):
        real.reproduce_real(out, scale="tiny", progress=False)
    real.reproduce_real(out, scale="tiny", progress=False, overwrite=True)
    assert uqmetrics.read_dataset(path).attrs["sigma_scaling_criterion"] == "nll"
    monkeypatch.setitem(real.SCALES, "tiny", replace(tiny, train=replace(tiny.train, epochs=3)))
    with pytest.raises(uqmetrics.InputError, match=r"config.train.epochs 2 \(asked 3\)"):
        real.reproduce_real(out, scale="tiny", progress=False)


def test_a_split_does_not_depend_on_the_others_nor_on_the_chunking():
    """Split k trains as the engine's repetition k on its own: its numbers are the same whether
    1 or 2 splits run, and with one network per chunk (results never depend on batch size)."""
    from dataclasses import replace

    from uqreg.real import REAL_TRAIN, RealConfig, run_real

    train = replace(REAL_TRAIN, members=2, epochs=2, mc_samples=3)
    cfg = RealConfig(splits="gap", n_splits=2, methods=("ens", "bd"), train=train)
    both = run_real(cfg, progress=False)
    one = run_real(replace(cfg, n_splits=1, train=replace(train, chunk_networks=1)), progress=False)
    first = both.isel(split=[0])  # the gap splits of diabetes all hold out 147 rows: no padding differs
    for v in ("prediction", "predictive_std", "coverage", "score_mace", "score_crps", "calibration_observed"):
        np.testing.assert_array_equal(one[v].values, first[v].values, err_msg=v)
