"""Values of the disentanglement protocol (docs/conventions.md#v-8) that the tests of
``protocols/disentangle/test_disentangle.py`` do not reach, each against a direct uqmetrics or
scipy call on the cached arrays: abstinence at a coverage whose ``c n`` is not an integer, the
severity task over severities 1 and 3, the temperature-scaled rows (fitted on the calibration
set, applied to every set), the per-predictor metrics of the mean member distribution, a
declared ensemble of multi-pass models, and the training-size task. Each check also asserts that
the inputs tell the documented rule from its nearest wrong variant (the check is not empty)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr
from uqmetrics import write_dataset
from uqmetrics.metrics.calibration import fit_temperature, softmax
from uqmetrics.metrics.classification import (
    accuracy_score,
    brier_loss,
    expected_calibration_error,
    nll_loss,
)
from uqmetrics.metrics.disentangle import ESTIMATORS, information_decomposition
from uqmetrics.metrics.ood import ood_auroc_score

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.disentangle.score import DisentangleConfig, score_disentangle

CLASSES = ["a", "b", "c"]
N = 18
LABELS = np.arange(N) % 3
COVERAGE = 0.8  # c n = 14.4: the 15 least uncertain are kept
SEVERITIES = (1, 3)
#: the member estimators (those that read the members alone)
MEMBER_ESTIMATORS = [n for n, e in ESTIMATORS.items_ordered() if e.needs == {"members"}]


def _logits(rng, passes, scale, spread):
    """(passes, N, 3) float32-exact logits: a shared part of size ``scale`` and per-pass noise
    of size ``spread``; every third image's shared top class is wrong."""
    top = (LABELS + (np.arange(N) % 3 == 0)) % 3
    shared = scale * (np.eye(3)[top] + 0.5 * rng.normal(size=(N, 3)))
    z = shared[None] + spread * rng.normal(size=(passes, N, 3))
    return z.astype(np.float32).astype(np.float64)


def _write(folder, model, dataset, logits, *, role="clean", mode="plain", **attrs):
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": 0,
             "eval_set": "folder", "role": role, **attrs}
    ds = cache_dataset(logits if logits.shape[0] > 1 else logits[0], LABELS,
                       samples=[f"{dataset}/{i}.png" for i in range(N)], classes=CLASSES,
                       attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, 0)}.nc")


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """Caches and their scores. ``mcd``: 4 MC-dropout passes on the test, an OOD and two
    corrupted sets (severities 1 and 3, more disagreement at 3); ``s``: one plain pass on the
    test, calibration (logits 4x too confident) and OOD sets; ``d1``, ``d2``: 3 passes each, the
    declared ensemble ``pair``; training fractions 0.5 (``mcd``) and 1 (``d1``)."""
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("mutants_disentangle")
    z = {("mcd", "test"): _logits(rng, 4, 2.0, 0.5), ("mcd", "ood"): _logits(rng, 4, 0.5, 1.5),
         ("mcd", "c1"): _logits(rng, 4, 1.5, 1.0), ("mcd", "c3"): _logits(rng, 4, 1.0, 2.0),
         ("s", "test"): _logits(rng, 1, 2.0, 0.0), ("s", "cal"): _logits(rng, 1, 8.0, 0.0),
         ("s", "ood"): _logits(rng, 1, 2.0, 0.0),
         ("d1", "test"): _logits(rng, 3, 2.0, 1.0), ("d2", "test"): _logits(rng, 3, 2.0, 1.0)}
    for (model, dataset), logits in z.items():
        mode = "plain" if model == "s" else "mc_dropout"
        kw = {}
        if dataset == "ood":
            kw = {"role": "ood", "eval_set": "ood-far"}
        elif dataset == "cal":
            kw = {"set_role": "calibration"}
        elif dataset.startswith("c"):
            s = int(dataset[1])
            kw = {"role": "shifted", "eval_set": "imagenet-c", "eval_member": f"noise-{s}",
                  "corruption": "noise", "severity": s}
        _write(folder, model, dataset, logits, mode=mode, **kw)
    config = DisentangleConfig(temperature=True, coverages=(COVERAGE,),
                               ensembles={"pair": ("d1", "d2")},
                               train_sizes={"mcd": ["mc", 0.5], "d1": ["mc", 1.0]})
    return score_disentangle(folder, config), {k: softmax(v) for k, v in z.items()}


def _u(name, members):
    return ESTIMATORS.lookup(name).score({"members": members})


def test_abstinence_keeps_the_ceil_of_c_n_least_uncertain_predictions(scored):
    ds, p = scored
    correct = (p["mcd", "test"].mean(0).argmax(1) == LABELS).astype(float)
    k = math.ceil(COVERAGE * N)
    differs = 0
    for name in MEMBER_ESTIMATORS:
        order = np.argsort(_u(name, p["mcd", "test"]), kind="stable")
        want = correct[order[:k]].mean()
        got = float(ds["abstinence_accuracy"].sel(model="mcd", estimator=name,
                                                  coverage=COVERAGE))
        assert got == pytest.approx(want, rel=1e-12), name
        differs += correct[order[:k - 1]].mean() != want
    assert differs  # keeping floor(c n) = 14 would give another accuracy


def test_severity_task_uses_the_severity_values_and_the_mean_auroc(scored):
    """``severity_auroc`` per severity against the clean test images, ``shift_auroc`` their mean,
    ``severity_spearman`` the rank correlation with the severity itself (0 clean, 1, 3)."""
    ds, p = scored
    spread = 0
    for name in MEMBER_ESTIMATORS:
        u = {s: _u(name, p["mcd", s]) for s in ("test", "c1", "c3")}
        sel = {"model": "mcd", "estimator": name}
        aurocs = [ood_auroc_score(u["test"], u[f"c{s}"]) for s in SEVERITIES]
        np.testing.assert_allclose(ds["severity_auroc"].sel(sel).values, aurocs, rtol=1e-12)
        assert float(ds["shift_auroc"].sel(sel)) == pytest.approx(np.mean(aurocs), rel=1e-12)
        rho = spearmanr(np.concatenate([u["test"], u["c1"], u["c3"]]),
                        np.repeat([0.0, *SEVERITIES], N))[0]
        assert float(ds["severity_spearman"].sel(sel)) == pytest.approx(rho, rel=1e-12)
        spread += aurocs[0] != aurocs[1]
    assert spread  # the best severity's AUROC is not the mean


def test_temperature_is_fitted_on_the_calibration_set_and_scales_every_set(scored):
    ds, p = scored
    t = fit_temperature(np.log(np.clip(p["s", "cal"][0], 1e-300, None)), LABELS)
    assert float(ds["temperature"].sel(model="s+ts")) == t
    assert fit_temperature(np.log(p["s", "test"][0]), LABELS) != pytest.approx(t, rel=0.1)

    def scaled(probs):
        return softmax(np.log(np.clip(probs, 1e-300, None)), temperature=t)

    for name in MEMBER_ESTIMATORS:
        if ESTIMATORS.lookup(name).min_members > 1:
            continue
        u_test, u_ood = _u(name, scaled(p["s", "test"])), _u(name, scaled(p["s", "ood"]))
        want = ood_auroc_score(u_test, u_ood)
        assert float(ds["ood_auroc"].sel(model="s+ts", estimator=name)) == \
            pytest.approx(want, rel=1e-12), name
        assert ood_auroc_score(u_test, _u(name, p["s", "ood"])) != pytest.approx(want)
    mean = scaled(p["s", "test"])[0]
    assert float(ds["nll"].sel(model="s+ts")) == pytest.approx(nll_loss(LABELS, mean), rel=1e-12)


def test_predictor_metrics_are_of_the_mean_member_distribution(scored):
    ds, p = scored
    mean = p["mcd", "test"].mean(0)
    for var, fn in (("accuracy", accuracy_score), ("ece", expected_calibration_error),
                    ("nll", nll_loss), ("brier", brier_loss)):
        assert float(ds[var].sel(model="mcd")) == pytest.approx(fn(LABELS, mean), rel=1e-12), var
    assert nll_loss(LABELS, p["mcd", "test"][0]) != pytest.approx(nll_loss(LABELS, mean))


def test_an_ensemble_rows_members_are_its_models_with_their_passes_averaged(scored):
    ds, p = scored
    members = np.stack([p["d1", "test"].mean(0), p["d2", "test"].mean(0)])
    assert int(ds["members"].sel(model="pair")) == 2
    split = information_decomposition(members)
    for name, want in (("expected_entropy", split.aleatoric),
                       ("mutual_information", split.epistemic)):
        np.testing.assert_allclose(ds["estimate"].sel(model="pair", estimator=name).values,
                                   want, rtol=1e-12, atol=1e-15)


def test_training_size_task_is_the_mean_estimate_per_fraction(scored):
    ds, _ = scored
    skewed = 0
    for row, fraction in (("mcd", 0.5), ("d1", 1.0)):
        for name in MEMBER_ESTIMATORS:
            u = ds["estimate"].sel(model=row, estimator=name).values
            got = float(ds["size_mean"].sel({"method": "mc", "fraction": fraction,
                                              "estimator": name}))
            assert got == pytest.approx(u.mean(), rel=1e-12), (row, name)
            skewed += np.median(u) != pytest.approx(u.mean())
    assert skewed  # the median would differ
