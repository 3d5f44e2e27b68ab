"""``uqvision reproduce selective --scale smoke`` end to end (issue 13 item 5), the
``uqvision metadata`` command, and the training regimes of the zoo."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import uqmetrics
import xarray as xr
from uqmetrics.runs.io import decode_attr

from uqvision.cache import index_caches, read_cache
from uqvision.cli import main
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.selective.plots import _risk_coverage_curves, plot_selective
from uqvision.protocols.selective.reproduce import ZOO_SCALES, plan_zoo


@pytest.fixture(scope="module")
def run_dir(smoke_run):
    return smoke_run("selective")[0]


def test_driver_is_registered():
    driver = VISION_PROTOCOLS.lookup("selective").reproduce
    assert set(driver.scales) == set(ZOO_SCALES.names())


def test_plan_pairs_students_with_their_plain_twin():
    teachers, jobs = plan_zoo("cpu", seed=0)
    sc = ZOO_SCALES["cpu"]
    assert len(teachers) == sc.teacher_members
    assert len({j.seed for j in teachers}) == sc.teacher_members
    for j in jobs:
        twin = [k for k in jobs if k.arch == j.arch and k.replicate == j.replicate
                and k.regime == "plain"]
        assert len(twin) == 1 and twin[0].seed == j.seed  # same init and batch order
    assert {j.regime for j in jobs if j.arch.name in sc.students} == {
        "plain", "label_smoothing", "distill"}
    assert len({j.tag for j in teachers + jobs}) == len(teachers) + len(jobs)


@pytest.mark.slow
def test_smoke_run_scores_every_model_with_metadata(run_dir):
    teachers, jobs = plan_zoo("smoke", seed=0)
    with xr.open_dataset(run_dir / "scores" / "selective.nc") as ds:
        ds = ds.load()
    keys = set(ds["metadata_key"].values.astype(str))
    assert {j.key for j in teachers + jobs} <= keys
    ens = [k for k in keys if k.startswith("ens/")]
    assert len(ens) == 1 and any(k.startswith("proto/") for k in keys)
    assert ds["metadata_known"].all()  # the zoo's own table knows every row
    mc = ds["method"].values == "mc_dropout"
    assert mc.sum() == 1 and int(ds["passes"].values[mc][0]) == ZOO_SCALES["smoke"].mc_passes
    soft = ds.isel(model=np.flatnonzero(~mc))
    distilled = soft["distillation"].values == "yes"
    assert distilled.sum() == len(ZOO_SCALES["smoke"].students)
    assert set(soft["teacher"].values[distilled]) == set(ens)
    # the ensemble row has the members' parameters together
    member = soft["params"].values[soft["regime"].values == "teacher_member"]
    assert soft["params"].values[soft["metadata_key"].values == ens[0]][0] == member.sum()
    for v in ("auroc", "aurc_c", "eaurc_c", "sac_95", "ece"):
        assert np.isfinite(soft[v].values).all(), v
    # both rows on the held-out test images (the default none_samples)
    assert list(ds["sample_set"].values) == ["heldout", "heldout"]
    assert list(ds["n_scored"].values) == [ds.attrs["n_eval"], ds.attrs["n_eval"]]
    assert ds.attrs["n_images"] == ds.attrs["n_eval"] + ds.attrs["n_calib"]
    analysis = json.loads((run_dir / "analysis.json").read_text())
    assert 0 <= analysis["correlations"]["all"]["ece~auroc"]["pvalue"] <= 1
    assert len(analysis["pairs_distillation"]) == len(ZOO_SCALES["smoke"].students)
    assert len(analysis["students_vs_teacher"]) == len(ZOO_SCALES["smoke"].students)
    figures = {p.name for p in (run_dir / "figures").glob("*.png")}
    assert {"selective_auroc_vs_ece_none.png", "selective_improvement_auroc.png",
            "selective_temperature_effect.png", "selective_aurc_vs_accuracy.png",
            "selective_risk_coverage.png"} <= figures
    assert "| distillation |" in (run_dir / "summary.md").read_text()


@pytest.mark.slow
def test_risk_coverage_curves_come_from_the_named_plain_caches(run_dir, tmp_path):
    """The risk-coverage figure's curves are those of the plain caches the score file names,
    recomputed here from one cache; away from its caches the file draws no such figure."""
    ds = uqmetrics.read_dataset(run_dir / "scores" / "selective.nc")
    curves = _risk_coverage_curves(ds)
    plain = [i for i in index_caches(decode_attr(ds.attrs["caches"])) if i.mode == "plain"]
    assert sorted(curves) == sorted(i.model for i in plain) and len(curves) >= 10
    one = read_cache(plain[0].path)
    p = uqmetrics.softmax(one["logits"].values)
    want = uqmetrics.risk_coverage_curve(p.argmax(1) == one["label"].values,
                                         uqmetrics.softmax_response(p))
    for got, expected in zip(curves[plain[0].model], want, strict=True):
        np.testing.assert_array_equal(got, expected)
    elsewhere = ds.assign_attrs(caches=json.dumps({str(tmp_path / "gone.nc"): "0" * 64}))
    assert _risk_coverage_curves(elsewhere) == {}
    assert "selective_risk_coverage.png" not in {
        p.name for p in plot_selective(elsewhere, tmp_path / "figures")}


@pytest.mark.slow
def test_rerun_of_a_moved_run_resumes_without_training(run_dir, tmp_path, capsys):
    """A run folder moved elsewhere resumes: no network is trained again, the distilled
    students included (their teachers are recorded by their weights, not their paths; before,
    the students of a moved folder were all retrained)."""
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)  # modification times kept
    before = {p.name: p.stat().st_mtime_ns for p in (moved / "models").glob("*.safetensors")}
    assert main(["--threads", "1", "reproduce", "selective", "--scale", "smoke", "--out",
                 str(moved)]) == 0
    steps = capsys.readouterr().err  # the driver's steps: stderr
    assert steps.count("training 0 of") == 2, steps  # the teachers' stage, then the students'
    assert {p.name: p.stat().st_mtime_ns for p in (moved / "models").glob("*.safetensors")
            } == before


@pytest.mark.slow
def test_metadata_command_lists_unknown_models(run_dir, tmp_path, capsys):
    caches = str(run_dir / "caches")
    assert main(["metadata", "--caches", caches, "--template", str(tmp_path / "t.csv")]) == 0
    unknown = capsys.readouterr().out.split()
    assert str(tmp_path / "t.csv") in unknown and len(unknown) > 5  # the zoo is not shipped
    assert main(["metadata", "--caches", caches, "--metadata",
                 str(run_dir / "metadata.csv")]) == 0
    assert capsys.readouterr().out.split() == []
    assert main(["metadata", "--fields"]) == 0
    assert "distillation" in capsys.readouterr().out


def test_reproduce_refuses_foreign_options(tmp_path, capsys):
    assert main(["reproduce", "selective", "--out", str(tmp_path), "--set", "epochs=3"]) == 2
    assert "unknown options ['epochs']" in capsys.readouterr().err
    assert main(["reproduce", "selective", "--out", str(tmp_path), "--data", "x"]) == 2
    assert "--data/--arch do not apply" in capsys.readouterr().err


def test_distillation_loss_is_hintons(trained):
    """The training hook: with teachers the loss is (1-a) CE + a T^2 KL(teacher_T || student_T)
    on the same batch (the mean of the teachers' tempered softmax), checked directly."""
    import torch.nn.functional as F

    from uqvision.data import DataConfig
    from uqvision.models import load_model, read_sidecar
    from uqvision.training.loop import ImageTrainConfig, _loss_function

    spec = f"test_byobnet={trained.checkpoint}"
    classes = read_sidecar(trained.checkpoint)["classes"]
    cfg = ImageTrainConfig(arch="test_byobnet", input_size=16, teachers=(spec, spec),
                      distill_alpha=0.7, distill_temperature=3.0, label_smoothing=0.1)
    teacher = load_model(spec, num_classes=len(classes))
    loss_fn = _loss_function(cfg, classes, teacher.data_config)
    torch.manual_seed(0)
    x, y, z = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3]), torch.randn(4, 10)
    with torch.no_grad():
        p_t = torch.softmax(teacher.model(x) / 3.0, 1)
    expected = 0.3 * F.cross_entropy(z, y, label_smoothing=0.1) + 0.7 * 9.0 * (
        p_t * (torch.log(p_t) - torch.log_softmax(z / 3.0, 1))).sum(1).mean()
    assert float(loss_fn(z, y, x)) == pytest.approx(float(expected), rel=1e-5)
    plain = _loss_function(ImageTrainConfig(label_smoothing=0.1), classes, teacher.data_config)
    assert float(plain(z, y, x)) == pytest.approx(float(F.cross_entropy(z, y,
                                                                        label_smoothing=0.1)))
    with pytest.raises(ValueError, match="label_smoothing"):
        _loss_function(ImageTrainConfig(label_smoothing=1.0), classes, teacher.data_config)
    other = DataConfig((3, 32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="expects input"):
        _loss_function(ImageTrainConfig(teachers=(spec,)), classes, other)
    with pytest.raises(ValueError, match="other classes"):
        _loss_function(ImageTrainConfig(teachers=(spec,)), [c + "x" for c in classes],
                       teacher.data_config)


def test_teacher_ensemble_cache_follows_its_members(tmp_path):
    """The ensemble cache is rebuilt when a member's checkpoint changed (a retrained teacher),
    and kept when its members are the same (before: kept whenever the file existed)."""
    from uqmetrics import write_dataset

    from uqvision.cache import cache_dataset, read_cache
    from uqvision.protocols.selective.reproduce import ensure_ensemble_cache

    rng = np.random.default_rng(0)
    labels, samples, classes = np.array([0, 1, 2, 1]), [f"s{i}.png" for i in range(4)], ["a", "b", "c"]

    def member(k, sha):
        attrs = {"model": f"m{k}", "dataset_name": "test", "mode": "plain", "pass_index": 0,
                 "checkpoint_sha256": sha, "num_params": 10}
        path = tmp_path / f"m{k}.nc"
        write_dataset(cache_dataset(rng.normal(size=(4, 3)), labels, samples=samples, classes=classes,
                                    attrs=attrs), path, overwrite=True)
        return path

    members = [member(0, "aa"), member(1, "bb")]
    ens = tmp_path / "ens.nc"
    assert ensure_ensemble_cache(members, ens, "ens/x", "x", "t")
    first = read_cache(ens)["logits"].values
    assert not ensure_ensemble_cache(members, ens, "ens/x", "x", "t")  # same members: kept
    members[1] = member(1, "cc")  # member 1 retrained
    assert ensure_ensemble_cache(members, ens, "ens/x", "x", "t")
    rebuilt = read_cache(ens)
    assert rebuilt.attrs["checkpoint_sha256"] == "aa,cc"
    assert not np.array_equal(rebuilt["logits"].values, first)


def test_score_and_sweep_options_take_their_defaults_from_the_selective_config():
    """``uqvision score selective`` and ``uqvision sweep``'s selective options are generated
    from :class:`SelectiveConfig`: parsed without them, they give its defaults."""
    from uqvision.cli import build_parser
    from uqvision.options import config_defaults, config_kwargs
    from uqvision.protocols.selective import SELECTIVE_OPTIONS
    from uqvision.protocols.selective.score import SelectiveConfig

    defaults = config_defaults(SelectiveConfig)
    parse = build_parser().parse_args
    for argv in (["score", "selective", "--caches", "c", "--out", "o.nc"],
                 ["sweep", "--models", "m", "--data", "d", "--out", "o"]):
        assert config_kwargs(parse(argv), SELECTIVE_OPTIONS) == {
            o.field: defaults[o.field] for o in SELECTIVE_OPTIONS}
