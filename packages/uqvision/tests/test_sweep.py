import pytest

from uqvision.predict import PredictConfig
from uqvision.protocols.selective.score import SelectiveConfig, score_selective
from uqvision.sweep import expand_models, plan_sweep, sweep_predictions


def test_wildcards_expand_through_the_registries():
    names = [s.name for s in expand_models(["test_vit*", "test_resnet.*", "tv/resnet1*"])]
    assert "test_vit" in names and "test_vit2" in names
    assert "test_resnet.r160_in1k" in names
    assert "tv/resnet18" in names
    with pytest.raises(ValueError, match="matches no model"):
        expand_models(["no_such_net*"])
    with pytest.raises(ValueError, match="did you mean"):
        expand_models(["test_vitt"])
    with pytest.raises(ValueError, match="twice"):
        expand_models(["test_vit", "test_vit"])


def test_models_without_local_weights_are_planned_for_the_hub_cache(digits, tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "test_vit.safetensors").write_bytes(b"")
    plan = plan_sweep(expand_models(["test_vit", "test_resnet"]), digits / "test",
                      PredictConfig(mode="tta", passes=2), weights_dir=tmp_path / "w")
    assert plan.refused == {}
    assert [c.key for c in plan.cells] == ["test_vit.test.tta-000", "test_vit.test.tta-001",
                                           "test_resnet.test.tta-000", "test_resnet.test.tta-001"]
    assert plan.cells[1].params["config"]["first_pass"] == 1
    # the weights folder's file first; the other model's weights come from the hub cache
    assert plan.cells[0].params["checkpoint"] == str(tmp_path / "w" / "test_vit.safetensors")
    assert plan.cells[2].params["checkpoint"] is None


@pytest.mark.slow
def test_sweep_on_a_local_cluster_survives_a_model_that_raises(spec, digits, tmp_path,
                                                                monkeypatch):
    from dask.distributed import Client, LocalCluster

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # test_vit's weights: not in this empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    models = [spec, f"test_byobnet={bad}", "test_vit"]
    caches = tmp_path / "caches"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        report = sweep_predictions(models, digits / "test", caches,
                                   PredictConfig(batch_size=32), client=client, threads=1)
        assert [p.name for p in report.computed] == ["test_byobnet+m0.test.plain-000.nc"]
        assert set(report.failed) == {"test_byobnet+broken.test.plain-000",
                                      "test_vit.test.plain-000"}
        assert "HF_HUB_OFFLINE is set" in report.failed["test_vit.test.plain-000"]
        again = sweep_predictions(models, digits / "test", caches,
                                  PredictConfig(batch_size=32), client=client, threads=1)
    assert again.computed == [] and [p.name for p in again.skipped] == [
        "test_byobnet+m0.test.plain-000.nc"]
    ds = score_selective([caches], SelectiveConfig(calibration_size=0.3))
    assert list(ds["model"].values) == ["test_byobnet@m0"]


def test_a_method_run_is_one_cell_per_sample_and_pass(digits, tmp_path):
    from uqvision.models import ModelSpec
    from uqvision.training.loop import ImageTrainConfig, train_model

    ckpt = train_model(digits / "train", tmp_path / "sse", ImageTrainConfig(
        arch="test_vit", method="sse", input_size=16,
        hparams={"cycles": "2", "cycle_epochs": "1", "batch_size": "32"})).checkpoint
    plan = plan_sweep([ModelSpec("test_vit", str(ckpt))], digits / "test",
                      PredictConfig(mode="tta", passes=2))
    assert [c.key for c in plan.cells] == [f"test_vit+sse+{k:03d}.test.tta-{p:03d}"
                                           for k in range(2) for p in range(2)]
    assert [(c.params["config"]["first_sample"], c.params["config"]["first_pass"])
            for c in plan.cells] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_rerun_refuses_caches_of_other_inputs_and_keeps_them(spec, digits, tmp_path):
    """A sweep resumes only caches of the same identity (as predict does): one computed with
    another seed is refused for its model, reported, and left as it is."""
    import hashlib

    from uqvision.predict import predict_to_files

    caches = tmp_path / "caches"
    (path,) = predict_to_files(spec, digits / "test", caches, PredictConfig(batch_size=32, seed=0))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    report = sweep_predictions([spec], digits / "test", caches, PredictConfig(batch_size=32, seed=1))
    assert report.computed == [] and report.skipped == []
    (row,) = report.failed
    assert "computed from other inputs" in report.failed[row] and "seed 0 vs 1" in report.failed[row]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
