"""Cross-package: the installed ``uqvision`` CLI runs the demo chain; plain xarray reopens its
caches and score files and uqmetrics, called directly on the cached logits, gives the stored
scores."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import uqmetrics
import xarray as xr


def test_uqvision_demo_rescored_by_uqmetrics(tmp_path):
    exe = shutil.which("uqvision")
    assert exe, "the uqvision console script must be installed"
    out = tmp_path / "demo"
    res = subprocess.run([exe, "demo", "--out", str(out), "--members", "2", "--epochs", "2", "--mc-passes", "3",
                          "--max-per-class", "30", "--n-orders", "2"], check=False, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    with xr.open_dataset(out / "scores" / "selective.nc") as sel:
        sel = sel.load()
    plain = [p for p in (out / "caches").glob("*.nc") if ".plain-" in p.name]
    assert plain, sorted(p.name for p in (out / "caches").glob("*"))
    n_calib = int(sel.attrs["n_calib"])
    for path in plain:
        with xr.open_dataset(path) as cache:
            cache = cache.load()
        model = str(cache.attrs["model"])
        logits, labels = cache["logits"].values.astype(np.float64), cache["label"].values
        ((calib, rest),) = uqmetrics.calibration_splits(labels, protocol="stratified_holdout", n_calib=n_calib,
                                                       seed=0)
        temperature = uqmetrics.fit_temperature(logits[calib], labels[calib])
        # both rows on the held-out images (the default --none-samples heldout), the unscaled
        # values on the held-out images in none_heldout too
        assert list(sel["sample_set"].values) == ["heldout", "heldout"]
        for name, t, idx in (("none", 1.0, rest), ("temperature", temperature, rest),
                             ("none_heldout", 1.0, rest)):
            probs = uqmetrics.metrics.calibration.softmax(logits[idx], temperature=t)
            y = labels[idx]
            correct, kappa = probs.argmax(1) == y, uqmetrics.softmax_response(probs)
            expected = {
                "accuracy": uqmetrics.accuracy_score(y, probs), "nll": uqmetrics.nll_loss(y, probs),
                "brier": uqmetrics.brier_loss(y, probs), "ece": uqmetrics.expected_calibration_error(y, probs),
                "auroc": uqmetrics.auroc_score(correct, kappa), "aurc": uqmetrics.aurc_loss(correct, kappa),
                "eaurc": uqmetrics.eaurc_loss(correct, kappa),
                "sac_95": uqmetrics.sac_score(correct, kappa, accuracy=0.95),
                "temperature": t,
            }
            for metric, value in expected.items():
                if name == "none_heldout":
                    if metric == "temperature":
                        continue
                    stored = sel["none_heldout"].sel({"model": model, "metric": metric})
                else:
                    stored = sel[metric].sel({"model": model, "calibration": name})
                np.testing.assert_allclose(float(stored), value, rtol=1e-6, atol=1e-9, err_msg=f"{model} {name} {metric}")

    with xr.open_dataset(out / "scores" / "ensembles.nc") as ens:
        ens = ens.load()
    # the deep ensemble measured against its own curve has DEE = its size wherever its mean CLL
    # sets a new high (recomputed here with uqmetrics from the stored curve)
    cll = ens.cll.sel({"method": "deep_ensemble"}).mean("order").values
    measured = np.isfinite(cll)
    cll, sizes = cll[measured], ens["size"].values[measured]
    ref = uqmetrics.deep_ensemble_equivalent(cll, sizes, cll)
    np.testing.assert_allclose(ens.dee.sel({"method": "deep_ensemble"}).values[measured], ref.dee, atol=1e-9)
    record = np.maximum.accumulate(cll) == cll
    np.testing.assert_allclose(ref.dee[record], sizes[record], atol=1e-9)
