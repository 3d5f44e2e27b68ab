"""Published numbers beside the user's (uqvision.published; issue 38): the shipped tables
against numbers written here from their sources, the mCE against AlexNet's published errors,
``uqvision compare`` and the report's published rows on real score files whose models are the
published checkpoints (the real scorers on synthetic caches), and the refusals."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
from uqmetrics import InputError, read_result, write_dataset

from uqvision import published
from uqvision.cache import cache_dataset, cache_key
from uqvision.cli import main
from uqvision.protocols.conformal.score import ConformalConfig, score_conformal
from uqvision.protocols.ood.score import OodConfig, score_ood
from uqvision.protocols.shift.score import ShiftConfig, score_shift

CLASSES = ["a", "b", "c", "d"]


def _cache(folder, model, dataset, logits, labels, **attrs):
    attrs = {"model": model, "dataset_name": dataset, "mode": "plain", "pass_index": 0,
             "eval_set": "folder", "role": "clean", **attrs}
    ds = cache_dataset(np.asarray(logits, np.float32), labels, classes=CLASSES,
                       samples=[f"{dataset}/{i}.png" for i in range(len(labels))], attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, 'plain', 0)}.nc")


def _logits(rng, labels, signal):
    z = rng.normal(size=(len(labels), len(CLASSES)))
    z[np.arange(len(labels)), np.maximum(labels, 0)] += signal * (labels >= 0)
    return z


# ------------------------------------------------------------------ the shipped tables


def test_openood_rows_are_the_leaderboards():
    t = published.load("openood-v1.5")
    assert t.protocol == "ood" and len(t.rows) == 69  # CrossEntropy, torchvision ckpt, 3 archs
    # results/imagenet1k_ood.csv of zjysteven/OpenOOD (branch leaderboard) at b158e839
    r50, vit, swin = (f"torchvision/{a}.IMAGENET1K_V1" for a in ("resnet50", "vit_b_16",
                                                                  "swin_t"))
    for ckpt, post, near, far, acc in [(r50, "MSP", 76.02, 85.23, 76.18),
                                       (r50, "ReAct", 77.38, 93.67, 76.18),
                                       (r50, "ASH", 78.17, 95.74, 76.18),
                                       (vit, "MSP", 73.52, 86.04, 81.14),
                                       (vit, "VIM", 77.03, 92.84, 81.14),
                                       (swin, "GEN", 78.97, 90.98, 81.59),
                                       (swin, "GradNorm", 47.58, 35.47, 81.59)]:
        assert t.value("near_auroc", checkpoint=ckpt, postprocessor=post) == near
        assert t.value("far_auroc", checkpoint=ckpt, postprocessor=post) == far
        assert t.value("id_accuracy", checkpoint=ckpt, postprocessor=post) == acc
    # the v1.5 release's 50 rows, then GEN's 3, then later entries
    added = [r["added"][:7] for r in t.rows]
    assert added.count("b674622") == 50 and added.count("b5c14fa") == 3
    assert t.value("near_auroc", checkpoint=r50, detector="maxlogit") == 76.46  # MLS
    assert t.sources["leaderboard"]["commit"] == "b158e839737803f6ac2ec3fe3ed376fdefdb4db7"


def test_raps_rows_are_tables_1_and_2():
    val, v2 = published.load("raps-imagenet-val"), published.load("raps-imagenet-v2")
    # 9 models x 2 levels x (accuracy + 4 predictors)
    assert len(val.rows) == len(v2.rows) == 90
    r50 = "torchvision/resnet50.IMAGENET1K_V1"
    rx = "torchvision/resnext101_32x8d.IMAGENET1K_V1"
    # experiments/outputs/imagenetresults_0_1.tex (Table 1)
    assert val.value("coverage", checkpoint=r50, alpha=0.1, method="naive") == 0.896
    assert val.value("mean_set_size", checkpoint=r50, alpha=0.1, method="naive") == 11.7
    assert val.value("mean_set_size", checkpoint=r50, alpha=0.1, method="raps") == 2.55
    assert val.value("mean_set_size", checkpoint=rx, alpha=0.1, method="aps") == 19.9
    assert val.value("mean_set_size", checkpoint=r50, alpha=0.1, method="topk") == 3.13
    assert val.value("top1", checkpoint=r50, alpha=0.1) == 0.761
    # imagenetresults_0_05.tex
    assert val.value("mean_set_size", checkpoint=rx, alpha=0.05, method="aps") == 46.5
    assert val.value("coverage", checkpoint=rx, alpha=0.05, method="naive") == 0.938
    # imagenetv2results_0_1.tex (Table 2), imagenetv2results_0_05.tex
    assert v2.value("mean_set_size", checkpoint="torchvision/resnet18.IMAGENET1K_V1",
                    alpha=0.1, method="raps") == 13.3
    assert v2.value("mean_set_size", checkpoint="torchvision/inception_v3.IMAGENET1K_V1",
                    alpha=0.05, method="naive") == 253.0
    assert val.sources["alpha_0.1"]["table"] == "Table 1"
    assert v2.sources["alpha_0.1"]["table"] == "Table 2"


def test_imagenet_c_rows_are_hendrycks_readme():
    t = published.load("imagenet-c")
    assert len(t.rows) == 19 * 6 + 1  # 19 corruptions x (5 severities + average); ResNet-50
    alex = "torchvision/alexnet.IMAGENET1K_V1"
    # hendrycks/robustness README.md at 76d93933 ("AlexNet ImageNet-C Error")
    assert t.value("error", checkpoint=alex, corruption="gaussian_noise", severity=1) == 0.69528
    assert t.value("error", checkpoint=alex, corruption="motion_blur", severity=5) == 0.92638
    assert t.value("error", checkpoint=alex, corruption="elastic_transform",
                   severity=3) == 0.55686
    assert t.value("error", checkpoint=alex, corruption="saturate", severity=2) == 0.65514
    # the README's leaderboard: ResNet-50 Baseline, mCE 76.7%, clean error 23.85%
    assert t.value("mce", checkpoint="torchvision/resnet50.IMAGENET1K_V1") == 76.7
    assert t.value("clean_error", checkpoint="torchvision/resnet50.IMAGENET1K_V1") == 23.85
    # google-research/augmix imagenet.py ALEXNET_ERR (9b9824c7): the 15 averages, which the
    # README's severities average to
    augmix = [0.886428, 0.894468, 0.922640, 0.819880, 0.826268, 0.785948, 0.798360, 0.866816,
              0.826572, 0.819324, 0.564592, 0.853204, 0.646056, 0.717840, 0.606500]
    order = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
             "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
             "elastic_transform", "pixelate", "jpeg_compression"]
    means = [t.value("mean_error", checkpoint=alex, corruption=c) for c in order]
    assert means == augmix
    per = published.published_baseline_errors("published:alexnet", order, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(per.mean(axis=1), augmix, atol=1e-6)


def test_every_number_is_cited():
    for name in published.names():
        t = published.load(name)
        for row in t.rows:
            line = t.citation(row["source"])
            assert re.search(r" at commit [0-9a-f]{40} \(https://github\.com/", line)
            assert row["checkpoint"] in published.checkpoints()


# ------------------------------------------------------------------ mCE against AlexNet

#: model -> right answers (of 20) per (corruption, severity); clean: 18 of 20
SHIFTED = {"tv/alexnet": {("gaussian_noise", 1): 6, ("gaussian_noise", 2): 4,
                          ("motion_blur", 1): 8, ("motion_blur", 2): 5},
           "resnet50.tv_in1k": {("gaussian_noise", 1): 14, ("gaussian_noise", 2): 11,
                                ("motion_blur", 1): 15, ("motion_blur", 2): 13}}
N = 20


def _right(k):
    """Logits of N images (labels 0..3 in turn) whose first ``k`` are predicted right."""
    labels = np.arange(N) % len(CLASSES)
    z = np.zeros((N, len(CLASSES)))
    z[np.arange(N), np.where(np.arange(N) < k, labels, (labels + 1) % len(CLASSES))] = 2.0
    return z + np.random.default_rng(k).normal(scale=0.1, size=z.shape), labels


@pytest.fixture(scope="module")
def shift_result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shift") / "caches"
    folder.mkdir()
    for model, cells in SHIFTED.items():
        _cache(folder, model, "val", *_right(17), set_role="calibration")
        _cache(folder, model, "test", *_right(18))
        for (c, s), k in cells.items():
            _cache(folder, model, f"c-{c}-{s}", *_right(k), role="shifted",
                   eval_set="imagenet-c", eval_member=f"{c}-{s}", corruption=c, severity=s)
    path = write_dataset(score_shift(folder, ShiftConfig(baseline="published:alexnet")),
                         folder.parent / "shift.nc")
    return path, read_result(path)


def test_mce_against_alexnets_published_errors(shift_result):
    _, ds = shift_result
    alex = {"gaussian_noise": (0.69528, 0.82542), "motion_blur": (0.5843, 0.70048)}  # README
    for model, cells in SHIFTED.items():
        ce = [sum(1 - cells[c, s] / N for s in (1, 2)) / sum(alex[c]) for c in alex]
        assert float(ds["mean_corruption_error"].sel(model=model)) == pytest.approx(
            np.mean(ce), rel=1e-12)
    # no relative mCE: AlexNet's clean error is not published with its corrupted errors
    assert "relative_mean_corruption_error" not in ds
    assert "relative mCE not computed" in ds.attrs["notes"]
    with pytest.raises(InputError, match=r"no published error for spatter/6"):
        published.published_baseline_errors("published:alexnet", ["spatter"], [6])
    with pytest.raises(InputError, match="or a published baseline: published:alexnet"):
        score_shift(shift_result[0].parent / "caches", ShiftConfig(baseline="alexnet"))


def test_compare_shift_alexnet_and_resnet50_rows(shift_result):
    path, ds = shift_result
    comp = published.compare(path, "imagenet-c")
    assert comp.matched == {"tv/alexnet": "torchvision/alexnet.IMAGENET1K_V1",
                            "resnet50.tv_in1k": "torchvision/resnet50.IMAGENET1K_V1"}
    rows = {(r["model"], r["column"], r["corruption"], r["severity"]): r for r in comp.rows}
    r = rows["tv/alexnet", "error", "motion_blur", 2]
    assert (r["published"], r["yours"]) == (0.70048, pytest.approx(1 - 5 / N))
    assert r["difference"] == pytest.approx(1 - 5 / N - 0.70048)
    r = rows["resnet50.tv_in1k", "mce", None, None]
    assert r["published"] == 76.7
    assert r["yours"] == pytest.approx(100 * float(ds["mean_corruption_error"].sel(
        model="resnet50.tv_in1k")))
    r = rows["resnet50.tv_in1k", "clean_error", None, None]
    assert (r["published"], r["unit"]) == (23.85, "%")
    assert r["yours"] == pytest.approx(100 * (1 - float(ds["clean_accuracy"].sel(
        model="resnet50.tv_in1k", calibration="none"))))
    # 4 of AlexNet's 95 errors are in the result: the others are said, not compared
    assert comp.n_unpaired() == 95 - 4
    assert comp.unpaired["the result has no severity"] == {"3": 2, "4": 2, "5": 2}
    assert len([r for r in comp.rows if r["model"] == "tv/alexnet"]) == 4


# ------------------------------------------------------------------ OOD: compare and report


@pytest.fixture(scope="module")
def ood_result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ood") / "caches"
    folder.mkdir()
    rng = np.random.default_rng(0)
    sets = {"test": ("clean", "", 40, 2.0), "ssb": ("ood", "near", 30, 0.8),
            "textures": ("ood", "far", 30, 0.0)}
    for model in ("resnet50.tv_in1k", "tv/swin_t", "mine"):
        for name, (role, split, n, signal) in sets.items():
            labels = np.arange(n) % len(CLASSES) if role == "clean" else np.full(n, -1)
            z = _logits(rng, labels, signal) if role == "clean" else \
                rng.normal(size=(n, len(CLASSES))) + signal * np.eye(len(CLASSES))[
                    rng.integers(0, len(CLASSES), n)]
            extra = {"ood_split": split, "eval_set": "imagenet-o"} if split else {}
            _cache(folder, model, name, z, labels, role=role, **extra)
    ds = score_ood(folder, OodConfig(detectors=("msp", "maxlogit", "energy", "entropy")))
    return write_dataset(ds, folder.parent / "ood.nc")


def test_compare_ood_command(ood_result, capsys):
    ds = read_result(ood_result)
    assert main(["compare", str(ood_result), "--published", "openood-v1.5"]) == 0
    text = capsys.readouterr().out
    assert "matched: resnet50.tv_in1k -> ResNet-50 (torchvision IMAGENET1K_V1)" in text
    assert "matched: tv/swin_t -> Swin-T (torchvision IMAGENET1K_V1)" in text
    assert "mine" not in text.split("setting of")[0]  # not a published checkpoint
    yours = 100 * float(ds["near_auroc"].sel(model="resnet50.tv_in1k", detector="msp"))
    line = next(x for x in text.splitlines()
                if x.startswith("resnet50.tv_in1k") and " msp " in x and "near_auroc" in x)
    assert line.split()[-4:] == ["76.02", f"{yours:.2f}", f"{yours - 76.02:+.2f}",
                                 "leaderboard"]
    line = next(x for x in text.splitlines()
                if x.startswith("tv/swin_t") and " MLS " in x and "far_auroc" in x)
    assert " 84.8 " in line  # Swin-T MaxLogit's far AUROC, as the leaderboard prints it
    # OpenOOD's other post-processors have no detector here (23 on ResNet-50, 11 on Swin-T,
    # near and far each); this file's entropy has no OpenOOD row
    assert "  published rows without a detector of this project (68): OpenMax, TempScale, " \
           "ODIN," in text
    assert "  the result has no detector (20): mahalanobis, react, vim, knn, gen" in text
    assert "[leaderboard] J. Zhang" in text and "b158e839737803f6ac2ec3fe3ed376fdefdb4db7" in text
    comp = published.compare(ood_result, "openood-v1.5")
    assert {(r["model"], r["detector"]) for r in comp.rows if r["column"] == "near_auroc"} == {
        (m, d) for m in ("resnet50.tv_in1k", "tv/swin_t") for d in ("msp", "maxlogit",
                                                                   "energy")}


def test_compare_refusals(ood_result, shift_result, capsys):
    def error(*argv):
        assert main(["compare", *map(str, argv)]) == 2
        return capsys.readouterr().err.strip()

    err = error(ood_result, "--published", "imagenet-c")
    assert err == (f"uqvision compare: error: result {str(ood_result)!r} is of protocol 'ood', "
                   "published table 'imagenet-c' of protocol 'shift' (tables for 'ood': "
                   "openood-v1.5)")
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(ood_result), "--published", "openood-v2"])
    assert stop.value.code == 2
    assert "invalid choice: 'openood-v2' (choose from 'imagenet-c', 'openood-v1.5', " \
           "'raps-imagenet-v2', 'raps-imagenet-val')" in capsys.readouterr().err
    # the project's own stand-in rows hold no published checkpoint: each side's are named
    ds = read_result(ood_result).sel(model=["mine"])
    with pytest.raises(InputError, match=r"the result's models are mine; the table's "
                       r"checkpoints are ResNet-50 \(torchvision IMAGENET1K_V1\) as "
                       r"resnet50\.tv_in1k or tv/resnet50\.IMAGENET1K_V1; Swin-T"):
        published.compare(ds, "openood-v1.5")


def test_report_shows_published_rows_cited_and_outside_the_manifest(ood_result, shift_result,
                                                                     tmp_path, capsys):
    site = tmp_path / "site"
    assert main(["report", str(ood_result), "--out", str(site), "--no-figures",
                 "--published", "openood-v1.5"]) == 0
    html = (site / "ood.html").read_text()
    assert "Published numbers (cited; not re-verifiable)" in html
    assert html.count('<tr class="published">') == len(
        published.compare(ood_result, "openood-v1.5").rows)
    assert 'data-value="76.02"' in html and "b158e839737803f6ac2ec3fe3ed376fdefdb4db7" in html
    data = json.loads((site / "data" / "ood.json").read_text())
    assert data["published"][0]["title"].startswith("openood-v1.5: ")
    manifest = json.loads((site / "manifest.json").read_text())
    assert len(manifest["entries"]) == len(data["rows"])  # the file's rows only
    assert all(not e["row"].startswith("published") for e in manifest["entries"])
    # a file of the protocol none of whose models is a published checkpoint: said, no rows
    (block,) = published.report_blocks(read_result(ood_result).sel(model=["mine"]),
                                       ["openood-v1.5", "imagenet-c"])
    assert block.rows == () and block.note.startswith(
        "no model of this result holds a checkpoint of the table: ResNet-50 (torchvision "
        "IMAGENET1K_V1) as resnet50.tv_in1k or tv/resnet50.IMAGENET1K_V1; ")
    capsys.readouterr()
    # a table of a protocol no file is of
    assert main(["report", str(ood_result), "--out", str(tmp_path / "s2"),
                 "--published", "raps-imagenet-val"]) == 2
    assert capsys.readouterr().err.strip() == (
        "uqvision report: error: --published raps-imagenet-val: no result file is of its "
        "protocol 'conformal' (theirs: ood)")


# ------------------------------------------------------------------ conformal


def test_compare_conformal_reads_table_1s_medians_at_alpha(tmp_path):
    from uqvision.exceptions import UqvisionWarning

    rng = np.random.default_rng(1)
    labels = np.arange(200) % len(CLASSES)
    for name in ("val", "test"):
        _cache(tmp_path, "resnet18.tv_in1k", name, _logits(rng, labels, 1.5), labels,
               **({"set_role": "calibration"} if name == "val" else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UqvisionWarning)  # few images per Mondrian class
        ds = score_conformal(tmp_path, ConformalConfig(trials=3, alphas=(0.1,)))
    comp = published.compare(ds, "raps-imagenet-val")
    rows = {(r["method"], r["column"]): r for r in comp.rows}
    r = rows["aps", "coverage"]
    assert (r["published"], r["alpha"]) == (0.9, 0.1)  # Table 1, ResNet18 APS
    # the median over the trials, each set on the temperature of its trial's calibration draw
    assert r["yours"] == float(ds["coverage_median"].sel(
        {"model": "resnet18.tv_in1k", "method": "aps", "alpha": 0.1, "calibration": "platt"}))
    r = rows["raps", "mean_set_size"]
    assert (r["published"], r["unit"]) == (4.38, "classes")
    assert r["yours"] == float(ds["mean_set_size_median"].sel(
        {"model": "resnet18.tv_in1k", "method": "raps", "alpha": 0.1, "calibration": "platt"}))
    assert rows["topk", "coverage"]["published"] == 0.9
    assert rows[None, "top1"]["published"] == 0.698
    assert rows[None, "top1"]["yours"] == float(ds["accuracy_median"].sel(
        model="resnet18.tv_in1k"))
    assert rows[None, "top5"]["published"] == 0.891
    # the 0.05 rows: no such level in the result
    assert comp.unpaired["the result has no alpha"]["0.05"] == 8  # 4 predictors x 2 columns
