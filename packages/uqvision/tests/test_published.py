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
    assert published.names() == ["imagenet-c", "openood-v1.5", "pitfalls-imagenet",
                                 "raps-imagenet-v2", "raps-imagenet-val", "selective-imagenet"]
    for name in published.names():
        t = published.load(name)
        for row in t.rows:
            line = t.citation(row["source"])
            if t.sources[row["source"]].get("repository"):  # read from a repository's file
                assert re.search(r" at commit [0-9a-f]{40} \(https://github\.com/", line)
            else:  # the paper's own text: its table or section, and where the paper is
                assert re.search(r"; (Table|Section) \d.* \(https://openreview\.net/", line)
            assert line.startswith(t.paper)
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
           "'pitfalls-imagenet', 'raps-imagenet-v2', 'raps-imagenet-val', " \
           "'selective-imagenet')" in capsys.readouterr().err
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


# ------------------------------------------------------------------ selective (V.1)

#: Galil, Dabbah & El-Yaniv 2023, Table 3, as printed: architecture -> (torchvision
#: architecture, Vanilla accuracy and AUROC, MC dropout accuracy and AUROC)
GALIL_TABLE_3 = {
    "MobileNetV3 Large": ("mobilenet_v3_large", 74.04, 86.88, 74, 86.14),
    "MobileNetV3 Small": ("mobilenet_v3_small", 67.67, 86.2, 67.55, 84.54),
    "MobileNetV2": ("mobilenet_v2", 71.88, 86.05, 71.81, 84.68),
    "VGG11": ("vgg11_bn", 70.37, 86.31, 70.21, 84.3),
    "VGG11 (no BatchNorm)": ("vgg11", 69.02, 86.19, 68.95, 83.94),
    "VGG13": ("vgg13_bn", 71.59, 86.3, 71.43, 84.37),
    "VGG13 (no BatchNorm)": ("vgg13", 69.93, 86.24, 69.71, 84.3),
    "VGG16": ("vgg16_bn", 73.36, 86.76, 73.33, 85.02),
    "VGG16 (no BatchNorm)": ("vgg16", 71.59, 86.63, 71.47, 84.97),
    "VGG19": ("vgg19_bn", 74.22, 86.52, 74.17, 85.06),
    "VGG19 (no BatchNorm)": ("vgg19", 72.38, 86.55, 72.37, 84.99)}
VIT_L = "timm/vit_large_patch16_384.augreg_in21k_ft_in1k"


def test_selective_rows_are_galils_table_3_and_section_3():
    t = published.load("selective-imagenet")
    assert t.protocol == "selective" and len(t.rows) == 2 * len(GALIL_TABLE_3) + 1
    for arch, (tv, acc, auroc, mc_acc, mc_auroc) in GALIL_TABLE_3.items():
        ckpt = f"torchvision/{tv}.IMAGENET1K_V1"
        assert t.value("accuracy", checkpoint=ckpt, method="softmax") == acc
        assert t.value("auroc", checkpoint=ckpt, method="softmax") == auroc
        assert t.value("accuracy", checkpoint=ckpt, method="mc_dropout") == mc_acc
        assert t.value("auroc", checkpoint=ckpt, method="mc_dropout") == mc_auroc
        assert t.value("auroc", checkpoint=ckpt, architecture=arch, kappa="Vanilla") == auroc
    # the best AUROC of the 523 models (Section 3); the paper prints no accuracy beside it
    assert t.value("auroc", checkpoint=VIT_L) == 88.5
    with pytest.raises(KeyError):
        t.value("accuracy", checkpoint=VIT_L)
    assert t.sources["table_3"]["table"].startswith("Table 3 ")
    assert t.sources["section_3"]["table"].startswith("Section 3, ")
    assert "repository" not in t.sources["table_3"]  # the paper's text, not a file


def test_table_3s_weights_are_torchvisions_v1_by_their_accuracy():
    """The paper names architectures ('taken from the PyTorch repository'); its vanilla
    accuracy is, to the two decimals printed, the acc@1 torchvision documents for the
    IMAGENET1K_V1 weights of the architecture the checkpoint names, and for no other weights
    of it (MobileNetV2's and MobileNetV3-Large's V2 weights differ)."""
    from torchvision.models import get_model_weights

    known = published.checkpoints()
    for tv, acc, *_ in GALIL_TABLE_3.values():
        ckpt = known[f"torchvision/{tv}.IMAGENET1K_V1"]
        matching = [w for w in get_model_weights(tv)
                    if round(w.meta["_metrics"]["ImageNet-1K"]["acc@1"], 2) == acc]
        assert [w.name for w in matching] == ["IMAGENET1K_V1"], tv
        assert ckpt.weights == matching[0].url
        assert f"tv/{tv}.IMAGENET1K_V1" in ckpt.models


def test_vit_l16_384_is_timm_0_4_12s_default():
    """timm 0.4.12 (the paper's, Section 3) named vit_large_patch16_384 the AugReg ImageNet-21k
    weights fine-tuned at 384 px (timm/models/vision_transformer.py at v0.4.12, commit
    7096b52a): today's vit_large_patch16_384.augreg_in21k_ft_in1k, the url its config keeps."""
    from timm.models import get_pretrained_cfg

    ckpt = published.checkpoints()[VIT_L]
    url = ("https://storage.googleapis.com/vit_models/augreg/L_16-i21k-300ep-lr_0.001-"
           "aug_medium1-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_384.npz")
    assert ckpt.weights == url
    assert get_pretrained_cfg("vit_large_patch16_384.augreg_in21k_ft_in1k").url == url
    assert set(ckpt.models) == {"vit_large_patch16_384.augreg_in21k_ft_in1k",
                                "vit_large_patch16_384"}


@pytest.fixture(scope="module")
def selective_result(tmp_path_factory):
    """A selective score file of MobileNetV3-Small (plain and 30 MC-dropout passes), ViT-L/16
    -384 and a model of no published checkpoint (the protocol's tests' synthetic caches)."""
    from uqvision.protocols.selective.score import SelectiveConfig, score_selective

    folder = tmp_path_factory.mktemp("selective") / "caches"
    folder.mkdir()
    rng = np.random.default_rng(4)
    labels = np.arange(120) % len(CLASSES)
    for model in ("tv/mobilenet_v3_small", "vit_large_patch16_384.augreg_in21k_ft_in1k",
                  "mine"):
        z = _logits(rng, labels, 1.5)
        _cache(folder, model, "test", z, labels, set_role="test")
        if model == "tv/mobilenet_v3_small":
            mc = z[None] + 0.5 * rng.normal(size=(30, *z.shape))
            ds = cache_dataset(np.asarray(mc, np.float32), labels, classes=CLASSES,
                               samples=[f"test/{i}.png" for i in range(len(labels))],
                               attrs={"model": model, "dataset_name": "test",
                                      "mode": "mc_dropout", "pass_index": 0,
                                      "eval_set": "folder", "role": "clean",
                                      "set_role": "test"})
            write_dataset(ds, folder / f"{cache_key(model, 'test', 'mc_dropout', 0)}.nc")
    ds = score_selective([folder], SelectiveConfig(calibration_size=0.25, seed=0))
    return write_dataset(ds, folder.parent / "selective.nc")


def test_compare_selective_reads_softmax_and_mc_dropout_rows(selective_result):
    ds = read_result(selective_result)
    assert "tv/mobilenet_v3_small+mc_dropout" in list(ds.indexes["model"])
    comp = published.compare(selective_result, "selective-imagenet")
    mob = "torchvision/mobilenet_v3_small.IMAGENET1K_V1"
    assert comp.matched == {"tv/mobilenet_v3_small": mob,
                            "tv/mobilenet_v3_small+mc_dropout": mob,
                            "vit_large_patch16_384.augreg_in21k_ft_in1k": VIT_L}
    rows = {(r["model"], r["column"]): r for r in comp.rows}
    assert len(rows) == len(comp.rows) == 5  # 2 + 2 + ViT's AUROC

    def yours(model, var):
        return 100 * float(ds[var].sel(model=model, calibration="none"))

    for model, method, acc, auroc in (("tv/mobilenet_v3_small", "softmax", 67.67, 86.2),
                                      ("tv/mobilenet_v3_small+mc_dropout", "mc_dropout",
                                       67.55, 84.54)):
        for column, published_value in (("accuracy", acc), ("auroc", auroc)):
            r = rows[model, column]
            assert (r["published"], r["method"], r["unit"]) == (published_value, method, "%")
            assert r["yours"] == pytest.approx(yours(model, column), rel=1e-12)
            assert r["difference"] == pytest.approx(yours(model, column) - published_value,
                                                    rel=1e-12)
            assert r["source"] == "table_3"
    # the two rows of one checkpoint are told apart: MC dropout's AUROC is the +mc_dropout row's
    assert rows["tv/mobilenet_v3_small", "auroc"]["yours"] != \
        rows["tv/mobilenet_v3_small+mc_dropout", "auroc"]["yours"]
    r = rows["vit_large_patch16_384.augreg_in21k_ft_in1k", "auroc"]
    assert (r["published"], r["source"], r["architecture"]) == (88.5, "section_3",
                                                                 "ViT-L/16-384")
    assert r["yours"] == pytest.approx(yours("vit_large_patch16_384.augreg_in21k_ft_in1k",
                                             "auroc"), rel=1e-12)
    assert comp.n_unpaired() == 0
    # without the MC-dropout row, its published numbers are said, not compared
    comp = published.compare(ds.sel(model=["tv/mobilenet_v3_small"]), "selective-imagenet")
    assert comp.unpaired == {"the result has no row of this method": {"MobileNetV3 Small": 2}}
    text = published.format_comparison(comp)
    assert "[table_3] I. Galil, M. Dabbah and R. El-Yaniv" in text
    assert "https://openreview.net/forum?id=p66AzKi6Xim" in text
    with pytest.raises(InputError, match=r"no model of result '<in memory>' holds a checkpoint"
                       r" of published table 'selective-imagenet': the base_model of the "
                       r"result's models are mine; "):
        published.compare(ds.sel(model=["mine"]), "selective-imagenet")


# ------------------------------------------------------------------ pitfalls (V.2)


def test_pitfalls_rows_are_tables_6_and_7():
    t = published.load("pitfalls-imagenet")
    assert t.protocol == "pitfalls" and len(t.rows) == 7
    ckpt = "pytorch-ensembles/deepens_imagenet"
    # Table 6, ResNet50 Deep Ensembles: error and negative CLL (mean +- std over 5 orders)
    for size, err, ncll in ((1, 23.79, 0.935), (5, 21.19, 0.823), (10, 20.90, 0.805),
                            (50, 20.63, 0.788)):
        assert t.value("error", checkpoint=ckpt, method="deep_ensemble", size=size) == err
        assert t.value("neg_cll", checkpoint=ckpt, method="deep_ensemble", size=size) == ncll
    assert t.value("neg_cll_std", checkpoint=ckpt, size=1) == 0.007
    with pytest.raises(KeyError):  # "± NA" at 50 members
        t.value("neg_cll_std", checkpoint=ckpt, size=50)
    # Table 7: the same after test-time augmentation (one augmentation per member)
    for size, err, ncll in ((5, 21.20, 0.855), (10, 20.16, 0.793), (50, 19.39, 0.739)):
        assert t.value("error", checkpoint=ckpt, method="deep_ensemble_tta", size=size) == err
        assert t.value("neg_cll", checkpoint=ckpt, tta=True, size=size) == ncll
    assert t.columns["neg_cll"]["unit"] == "nats"
    assert t.columns["neg_cll"]["result"]["scale"] == -1  # the result's cll: higher is better


def test_released_members_are_matched_by_file_name():
    ckpt = published.checkpoints()["pytorch-ensembles/deepens_imagenet"]
    assert ckpt.holds("tv/resnet50@ImageNet-ResNet50-7.pth")  # NAME=FILE -> NAME@stem
    assert not ckpt.holds("tv/resnet50@ImageNet-SSE_ResNet50-7.pth")  # a snapshot ensemble
    assert not ckpt.holds("ImageNet-ResNet50-7")  # not a local file's row
    assert not ckpt.holds("tv/resnet50")


def _pitfalls_result(folder, write_cache, member_logits, members, tta_draws=2):
    """A pitfalls score file of ``members`` (caches of no training method, named as the deep
    ensemble: --members), plain and with ``tta_draws`` augmentations each."""
    from uqvision.protocols.pitfalls.score import EnsembleConfig, score_ensembles

    rng = np.random.default_rng(7)
    y, z = member_logits(rng, 200, 4, len(members), signal=1.0, noise=2.0)
    for m, zk in zip(members, z, strict=True):
        write_cache(folder, zk, y, model=m)
        for d in range(tta_draws):
            write_cache(folder, zk + rng.normal(size=zk.shape), y, model=m, mode="tta",
                        pass_index=d)
    return score_ensembles([folder], EnsembleConfig(members=members, n_orders=3,
                                                    n_repeats=2))


def test_compare_pitfalls_reads_the_deep_ensemble_by_size(tmp_path, write_cache, member_logits):
    members = [f"tv/resnet50@ImageNet-ResNet50-{k}.pth" for k in range(5)]
    ds = _pitfalls_result(tmp_path, write_cache, member_logits, members)
    comp = published.compare(ds, "pitfalls-imagenet")
    ckpt = "pytorch-ensembles/deepens_imagenet"
    assert comp.matched == {"deep_ensemble": ckpt, "deep_ensemble_tta": ckpt}
    rows = {(r["model"], r["size"], r["column"]): r for r in comp.rows}
    assert set(rows) == {("deep_ensemble", s, c) for s in (1, 5) for c in ("error", "neg_cll")} \
        | {("deep_ensemble_tta", 5, c) for c in ("error", "neg_cll")}
    for method, size, ncll, err in (("deep_ensemble", 1, 0.935, 23.79),
                                    ("deep_ensemble", 5, 0.823, 21.19),
                                    ("deep_ensemble_tta", 5, 0.855, 21.20)):
        curve = ds.sel({"method": method, "size": size})
        r = rows[method, size, "neg_cll"]
        # minus the CLL (higher is better), the mean over the member orders, as the paper's
        # mean over its 5 orders
        mine = -float(curve["cll"].mean("order"))
        assert (r["published"], r["unit"]) == (ncll, "nats")
        assert r["yours"] == pytest.approx(mine, rel=1e-12) and mine > 0
        assert r["difference"] == pytest.approx(mine - ncll, rel=1e-12)
        r = rows[method, size, "error"]
        mine = 100 * (1 - float(curve["accuracy"].mean("order")))
        assert (r["published"], r["yours"]) == (err, pytest.approx(mine, rel=1e-12))
    # the orders differ at size 1, so the mean is not order 0's value
    assert np.ptp(ds["cll"].sel({"method": "deep_ensemble", "size": 1}).values) > 0
    # 10 and 50 members: not in a 5-member result, said
    assert comp.unpaired == {"the result has no size": {"10": 4, "50": 4}}
    assert rows["deep_ensemble", 5, "neg_cll"]["source"] == "table_6"
    assert rows["deep_ensemble_tta", 5, "neg_cll"]["source"] == "table_7"
    assert "[table_7] A. Ashukha" in published.format_comparison(comp)


def test_compare_pitfalls_refuses_an_ensemble_not_of_the_release(tmp_path, write_cache,
                                                                member_logits):
    # one member that is not a released file: the ensemble is not the paper's
    members = [f"tv/resnet50@ImageNet-ResNet50-{k}.pth" for k in range(2)] + ["mine@run0"]
    ds = _pitfalls_result(tmp_path, write_cache, member_logits, members, tta_draws=0)
    with pytest.raises(InputError, match=r"no method of result '<in memory>' holds a "
                       r"checkpoint of published table 'pitfalls-imagenet': the result's "
                       r"members \(its attr members\) are tv/resnet50@ImageNet-ResNet50-0\.pth,"
                       r" .*, mine@run0; the table's checkpoints are Ashukha et al\.'s .* as "
                       r"NAME@ImageNet-ResNet50-\*"):
        published.compare(ds, "pitfalls-imagenet")
    (block,) = published.report_blocks(ds, ["pitfalls-imagenet"])
    assert block.rows == () and block.note.startswith("no method of this result holds")


# ------------------------------------------------------------------ the table format


@pytest.mark.parametrize("change, message", [
    (lambda d: d["sources"]["table_6"].update(repository="SamsungLabs/pytorch-ensembles"),
     r"source 'table_6' lacks \['file', 'commit'\]"),
    (lambda d: d["sources"]["table_6"].update(repository="a/b", file="f", commit="7c31c24b"),
     r"source 'table_6' lacks \['a 40-hex commit'\]"),
    (lambda d: d["sources"]["table_7"].pop("url"), r"source 'table_7' lacks \['url'\]"),
    (lambda d: d["match"].update(weights="everything"), r"match must have dim .* got "),
    (lambda d: d["match"].update(rows="method"), r"match must have dim .* got "),
])
def test_a_bad_table_file_is_refused_naming_it(change, message):
    from importlib import resources

    f = resources.files("uqvision") / "resources" / "published" / "pitfalls-imagenet.json"
    data = json.loads(f.read_text(encoding="utf-8"))
    published._check_table(data, "x.json")  # the shipped file is valid
    change(data)
    with pytest.raises(InputError, match=rf"^published table file 'x\.json': {message}"):
        published._check_table(data, "x.json")
