"""The disentanglement protocol (V.8, uqvision.protocols.disentangle): scoring on synthetic caches
with known answers, each value against a direct uqmetrics/scipy call on the same arrays; the
ReaL-to-distribution rule (untangle's) on tiny hand-made files and against a re-derivation on
random raters; findings and figures; the smoke reproduction's files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import spearmanr
from uqmetrics import InputError, write_dataset
from uqmetrics.metrics.calibration import softmax
from uqmetrics.metrics.disentangle import ESTIMATORS
from uqmetrics.metrics.ood import ood_auroc_score
from uqmetrics.metrics.selective import aurc_loss, auroc_score

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.disentangle.findings import disentangle_findings, format_findings
from uqvision.protocols.disentangle.score import DisentangleConfig, score_disentangle
from uqvision.protocols.disentangle.truth import (
    label_distribution_entropy,
    real_label_distributions,
)

CLASSES = ["a", "b", "c"]
N = 18
#: each test image's ReaL label set (indices into CLASSES): sizes 1, 2 and 3 in turn
LABEL_SETS = [[i % 3] if i % 3 == 0 else [i % 3, (i + 1) % 3] if i % 3 == 1 else [0, 1, 2]
              for i in range(N)]
SAMPLES = [f"n0/ILSVRC2012_val_{i + 1:08d}.JPEG" for i in range(N)]
LABELS = np.arange(N) % 3


def _truth_probs():
    p = np.zeros((N, 3))
    for i, s in enumerate(LABEL_SETS):
        p[i, s] = 1.0 / len(s)
    return p


def _write(folder, model, dataset, logits, *, role="clean", eval_set="folder", corruption="",
           severity=0, mode="plain", set_role=None, embedding=None, uncertainty=None, n=N):
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": 0,
             "eval_set": eval_set, "role": role}
    if set_role:
        attrs["set_role"] = set_role
    if corruption:
        attrs.update(eval_member=f"{corruption}-{severity}", corruption=corruption,
                     severity=severity)
    samples = SAMPLES if dataset == "test" else [f"{dataset}/{i}.png" for i in range(n)]
    ds = cache_dataset(logits, np.arange(n) % 3, samples=samples, classes=CLASSES,
                       embedding=embedding, uncertainty=uncertainty, attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, 0)}.nc")


def _passes(n, agree, seed):
    """(4, n, 3) logits: passes that nearly agree (spread 0.1 where ``agree``) or not (3);
    every fourth image's agreed class is not its label."""
    rng = np.random.default_rng(seed)
    top = (np.arange(n) + (np.arange(n) % 4 == 0)) % 3
    base = np.log(np.full((n, 3), 0.1) + 0.7 * np.eye(3)[top])
    noise = rng.normal(size=(4, n, 3)) * np.where(agree, 0.1, 3.0)[None, :, None]
    return base[None] + noise


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """``oracle``: one pass whose softmax is the true label distribution of every test image;
    ``lp``: uniform logits, its own ``uncertainty`` the true entropy; ``mcd``: 4 passes that
    agree on the ID test images and disagree on the OOD and corrupted
    ones; a real.json with the test images' label sets."""
    folder = tmp_path_factory.mktemp("disentangle")
    c = folder / "caches"
    c.mkdir()
    _write(c, "oracle", "test", np.log(_truth_probs() + 1e-12))
    _write(c, "oracle", "ood", np.zeros((N, 3)), role="ood", eval_set="ood-far")
    _write(c, "mcd", "test", _passes(N, np.ones(N, bool), 1), mode="mc_dropout")
    _write(c, "mcd", "ood", _passes(N, np.zeros(N, bool), 2), mode="mc_dropout", role="ood",
           eval_set="ood-far")
    for s in (1, 2):
        z = _passes(N, np.zeros(N, bool), 10 + s)
        _write(c, "mcd", f"c-noise-{s}", z, mode="mc_dropout", role="shifted",
               eval_set="imagenet-c", corruption="noise", severity=s)
    # a method that predicts its own uncertainty (a loss-prediction head): the true entropy
    _write(c, "lp", "test", np.zeros((N, 3)),
           uncertainty=np.log([len(s) for s in LABEL_SETS]).astype(np.float32))
    real = folder / "real.json"
    real.write_text(json.dumps(LABEL_SETS))
    return c, real


def test_an_estimate_of_the_true_entropy_ranks_it_perfectly(caches):
    c, real = caches
    ds = score_disentangle(c, DisentangleConfig(truth=str(real)))
    assert ds.attrs["protocol"] == "disentangle"
    np.testing.assert_allclose(ds["true_entropy"].values,
                               np.log([len(s) for s in LABEL_SETS]), atol=1e-12)
    for e in ("entropy", "expected_entropy", "one_minus_max_prob"):
        assert float(ds["aleatoric_spearman"].sel(model="oracle", estimator=e)) == \
            pytest.approx(1.0, abs=1e-12), e
    # the learned estimator reads the uncertainty a method predicts itself, and only that
    assert float(ds["aleatoric_spearman"].sel(model="lp", estimator="learned")) == \
        pytest.approx(1.0, abs=1e-12)
    assert np.isnan(ds["aleatoric_spearman"].sel(model="oracle", estimator="learned"))
    # a single pass: the disagreement terms are not scored (NaN), not 0
    assert np.isnan(ds["ood_auroc"].sel(model="oracle", estimator="mutual_information"))
    assert int(ds["members"].sel(model="mcd")) == 4


def test_disagreement_detects_ood_and_shift_perfectly(caches):
    c, _ = caches
    ds = score_disentangle(c)
    for e in ("mutual_information", "bregman_epistemic"):
        assert float(ds["ood_auroc"].sel(model="mcd", estimator=e)) == 1.0
        assert ds["severity_auroc"].sel(model="mcd", estimator=e).values.tolist() == [1.0, 1.0]
        assert float(ds["shift_auroc"].sel(model="mcd", estimator=e)) == 1.0
    assert list(ds["severity"].values) == [1, 2]
    assert np.isnan(ds["aleatoric_spearman"]).all()  # no truth: no aleatoric task


def _untangle_aurc(u, correct):
    """untangle's AURC (utils/metric.py, re-derived from its description): images sorted by
    ascending uncertainty, the mean over k of the error rate of the first k."""
    errors = np.cumsum(1 - correct[np.argsort(u, kind="stable")])
    return float(np.mean(errors / np.arange(1, u.size + 1)))


def test_every_value_equals_a_direct_call_on_the_same_arrays(caches):
    c, real = caches
    ds = score_disentangle(c, DisentangleConfig(truth=str(real), coverages=(0.5, 1.0)))
    z = _passes(N, np.ones(N, bool), 1).astype(np.float32).astype(np.float64)  # as cached
    p = softmax(z)
    correct = (p.mean(0).argmax(1) == LABELS).astype(float)
    zo = _passes(N, np.zeros(N, bool), 2).astype(np.float32).astype(np.float64)
    h = np.log([len(s) for s in LABEL_SETS])
    u, untied = {}, 0
    for name, est in ESTIMATORS.items_ordered():
        if est.needs != {"members"}:
            continue
        u[name] = est.score({"members": p})
        uo = est.score({"members": softmax(zo)})
        sel = {"model": "mcd", "estimator": name}
        assert float(ds["correctness_auroc"].sel(sel)) == pytest.approx(
            auroc_score(correct, -u[name]), nan_ok=True)
        assert float(ds["aurc"].sel(sel)) == pytest.approx(aurc_loss(correct, -u[name]))
        assert float(ds["auac"].sel(sel)) == pytest.approx(1 - aurc_loss(correct, -u[name]))
        if np.unique(u[name]).size == N:  # untied: untangle's AURC and AUAC = 1 - AURC
            untied += 1
            assert float(ds["aurc"].sel(sel)) == pytest.approx(_untangle_aurc(u[name], correct))
            assert float(ds["auac"].sel(sel)) == pytest.approx(
                1 - _untangle_aurc(u[name], correct))
        assert float(ds["ood_auroc"].sel(sel)) == pytest.approx(ood_auroc_score(u[name], uo))
        rho = spearmanr(u[name], h)[0] if np.ptp(u[name]) > 0 else np.nan
        assert float(ds["aleatoric_spearman"].sel(sel)) == pytest.approx(rho, nan_ok=True)
        keep = np.argsort(u[name], kind="stable")[:N // 2]
        assert float(ds["abstinence_accuracy"].sel(sel).sel(coverage=0.5)) == \
            pytest.approx(correct[keep].mean())
        assert float(ds["abstinence_accuracy"].sel(sel).sel(coverage=1.0)) == \
            pytest.approx(correct.mean())
        np.testing.assert_allclose(ds["estimate"].sel(sel).values, u[name], rtol=1e-12)
    assert untied >= 4  # every member estimator of the mcd passes
    assert float(ds["ae_spearman"].sel(model="mcd", aleatoric="expected_entropy",
                                       epistemic="mutual_information")) == pytest.approx(
        spearmanr(u["expected_entropy"], u["mutual_information"])[0], nan_ok=True)


def test_findings_and_figures_from_a_result(caches, tmp_path):
    from uqvision.protocols.disentangle.figures import draw_figures

    c, real = caches
    ds = score_disentangle(c, DisentangleConfig(truth=str(real)))
    rows = disentangle_findings(ds)
    assert rows[0].claim.startswith("aleatoric and epistemic estimates are almost perfectly")
    assert rows[0].n == 1 and "Spearman" in rows[0].statistic
    assert "| claim |" in format_findings(rows)
    paths = draw_figures(ds, tmp_path / "f")
    assert sorted(p.name for p in paths) == ["estimates_vs_truth.png",
                                             "estimator_task_heatmap.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_a_truth_that_does_not_cover_the_caches_is_refused(caches, tmp_path):
    c, _ = caches
    with pytest.raises(InputError, match="truth must be"):
        score_disentangle(c, DisentangleConfig(truth=str(tmp_path / "nothing.txt")))
    with pytest.raises(InputError, match="coverages"):
        DisentangleConfig(coverages=(0.0,))


# ------------------------------------------------------------------------- the ReaL rule


def test_real_sets_become_uniform_distributions_and_unlabelled_images_are_left_out(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps([[3], [1, 4], [], [0, 1, 2, 3]]))
    ids = ["n1/ILSVRC2012_val_00000002.JPEG", "ILSVRC2012_val_00000003.JPEG",
           "ILSVRC2012_val_00000001.JPEG", "other.png", "ILSVRC2012_val_00000004.JPEG"]
    probs, valid = real_label_distributions(real, ids, n_classes=5)
    assert valid.tolist() == [True, False, True, False, True]
    np.testing.assert_array_equal(probs[0], [0, 0.5, 0, 0, 0.5])
    np.testing.assert_array_equal(probs[2], [0, 0, 0, 1, 0])
    np.testing.assert_array_equal(probs[4], [0.25, 0.25, 0.25, 0.25, 0])
    assert not probs[[1, 3]].any()
    h = label_distribution_entropy(probs)
    assert h[0] == pytest.approx(np.log(2)) and h[2] == 0 and np.isnan(h[1])


def _untangle_rule(tensor, info, real, n_images, n_classes):
    """untangle's soft labels (datasets/soft_imagenet.py, re-derived from its description):
    yes-vote counts per (image, class) summed over annotators; an image with no yes vote but a
    ReaL set gets one count per class of its set; rows normalised; no count: no row."""
    counts = np.zeros((n_images, n_classes))
    yes = tensor.sum(axis=0)[:, 2]
    for q in range(len(info)):
        counts[int(str(info[q, 0])[-13:-5]) - 1, int(info[q, 1])] += yes[q]
    for i, labels in enumerate(real):
        if labels and counts[i].sum() == 0:
            counts[i, labels] = 1
    total = counts.sum(1, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def test_raters_votes_follow_untangles_rule_on_random_files(tmp_path):
    rng = np.random.default_rng(0)
    n_images, n_classes, n_q, n_ann = 12, 6, 30, 4
    names = np.array([f"ILSVRC2012_val_{i + 1:08d}.JPEG" for i in rng.integers(0, 8, n_q)])
    info = np.stack([names, rng.integers(0, n_classes, n_q).astype(str)], axis=1)
    # one-hot answers (no, unsure, yes) per annotator and question; some annotators skip
    answers = np.eye(3)[rng.integers(0, 3, (n_ann, n_q))] * (rng.random((n_ann, n_q, 1)) < 0.8)
    np.savez(tmp_path / "raters.npz", tensor=answers, info=info)
    real = [sorted(set(rng.integers(0, n_classes, rng.integers(0, 3)).tolist()))
            for _ in range(n_images)]
    ids = [f"ILSVRC2012_val_{i + 1:08d}.JPEG" for i in range(n_images)]
    probs, valid = real_label_distributions(real, ids, raters=tmp_path / "raters.npz",
                                            n_classes=n_classes)
    want = _untangle_rule(answers, info, real, n_images, n_classes)
    np.testing.assert_allclose(probs, want, atol=1e-12)
    assert valid.tolist() == (want.sum(1) > 0).tolist()
    assert (want.sum(1) > 0).any() and not (want.sum(1) > 0).all()  # both kinds drawn


# ------------------------------------------------------------------------- the smoke run


@pytest.mark.slow
def test_the_smoke_reproduction_writes_scores_figures_and_findings(smoke_run):
    import xarray as xr

    out, path = smoke_run("disentangle")
    with xr.open_dataset(path) as ds:
        models = [str(m) for m in ds["model"].values]
        assert {"deep_ensemble_f100[2]", "deep_ensemble_f10[2]", "swag_f100[2]"} <= set(models)
        assert any(m.endswith("+ts") for m in models)  # the temperature-scaled rows
        assert np.isfinite(ds["true_entropy"]).all() and (ds["true_entropy"] > 0).any()
        assert list(ds["fraction"].values) == [0.1, 0.5, 1.0]
        assert np.isfinite(ds["ood_auroc"].sel(model="deep_ensemble_f100[2]",
                                               estimator="mutual_information"))
        # HET-XL and the loss-prediction head: single-pass classifiers whose own uncertainty is
        # the estimator `learned`, read from their caches
        for method in ("hetxl", "losspred"):
            row = next(m for m in models if f"@{method}_f100_" in m and "+" not in m)
            learned = ds["estimate"].sel(model=row, estimator="learned").values
            cache = next((out / "caches").glob(f"*{method}_f100_*.test.plain-000.nc"))
            with xr.open_dataset(cache) as c:
                np.testing.assert_allclose(learned, c["uncertainty"].values, rtol=1e-6)
            assert np.isnan(ds["estimate"].sel(model=row, estimator="mutual_information")).all()
        # TTA: the first member's augmented passes, a row of its own
        tta = next(m for m in models if m.endswith("@tta_f100"))
        assert int(ds["members"].sel(model=tta)) == 2
        with xr.open_dataset(next((out / "caches").glob("*tta_f100.test.tta-000.nc"))) as c:
            assert c.attrs["tta_policy"] == "crop"  # no flips: a flip changes stand-in classes
        assert (ds["estimate"].sel(model=tta, estimator="mutual_information") > 0).any()
        assert {"hetxl", "losspred", "tta"} <= {str(m) for m in ds["method"].values}
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "estimates_vs_truth.png", "estimator_task_heatmap.png"]
    assert "almost perfectly rank-correlated" in (out / "findings.md").read_text()
