"""Three gaps at the boundary between the caches and the models:

1. a model that records no class names (random weights; a checkpoint whose sidecar names
   none) takes them from ``PredictConfig.model_classes``, which makes its head and its
   labels: a cache of one class space is never reused for a request of another
   (``model_classes`` in :data:`uqvision.predict.IDENTITY_FIELDS`);
2. a ``--model-kwargs`` key (or a sidecar's ``model_kwargs`` key) the timm model does not take
   is one line naming the option (or the sidecar), the key and the model, before any
   training or prediction, not timm's ``TypeError`` traceback;
3. the BatchNorm folder of a SWAG run is hashed once per command (and once per sweep, in
   its plan), while an image changed in place between two commands is still detected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from uqmetrics import InputError

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.data import folders as folders_module
from uqvision.models import ModelSpec
from uqvision.predict import PredictConfig, cache_identity, predict_to_files

#: A random network on the 32-pixel stand-in images (uqvision's own small CNN).
RANDOM = "uqvision_cnn"
DIGITS = tuple(str(i) for i in range(10))


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob("*.nc"))}


def _error_line(capsys) -> str:
    """The command's stderr: exactly one line, returned."""
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err



# -- 1. the class space of a model that records none -----------------------------------------
def test_a_cache_of_one_class_space_is_not_reused_for_another(digits, tmp_path):
    """A random network predicted with the 10 digits as its classes, then asked for 11 (its
    head has 11 outputs) or for the digits in another order (other labels): before, both
    requests silently got the 10-class cache back; now each is refused naming
    ``model_classes``, before anything is computed, and the same classes resume."""
    out = tmp_path / "caches"
    cfg = PredictConfig(allow_random_init=True, batch_size=32, model_classes=DIGITS)
    (path,) = predict_to_files(RANDOM, digits / "test", out, cfg, dataset_name="t")
    assert read_cache(path).sizes["class"] == 10
    before = _hashes(out)
    assert predict_to_files(RANDOM, digits / "test", out, cfg, dataset_name="t") == [path]
    for other in ((*DIGITS, "10"), DIGITS[::-1]):
        with pytest.raises(InputError, match=r"model_classes \('0', '1', .*\) vs \("):
            predict_to_files(RANDOM, digits / "test", out, PredictConfig(
                allow_random_init=True, batch_size=32, model_classes=other), dataset_name="t")
    assert _hashes(out) == before
    # and the cache of the folder's own classes (model_classes None) is another class space
    with pytest.raises(InputError, match=r"model_classes \('0', .*\) vs None"):
        predict_to_files(RANDOM, digits / "test", out, PredictConfig(
            allow_random_init=True, batch_size=32), dataset_name="t")
    assert _hashes(out) == before


def test_a_cache_recorded_before_model_classes_reads_as_none():
    """A cache written before ``PredictConfig.model_classes`` existed took its classes from
    its folder (or its weights): its config lacks the field, read as ``None``, the value it
    had; a list (what JSON gives back) is read as the tuple a request holds."""
    old = cache_identity({"config": json.dumps({"seed": 0, "logits": True})})
    assert old["model_classes"] is None
    new = cache_identity({"config": json.dumps({"model_classes": ["b", "a"]})})
    assert new["model_classes"] == ("b", "a") == PredictConfig(
        model_classes=["b", "a"]).model_classes


def test_a_sweep_resumes_a_random_models_ood_caches_in_the_data_classes(digits, tmp_path,
                                                                        one_class_folder):
    """A sweep gives a random network's OOD cells the ``--data`` classes (its class space
    never comes from an OOD folder); its check of the caches already there compares them
    with those classes, not with the target's own (``None``): caches of the same sweep
    resume, they are not refused as another class space."""
    from uqvision.sweep import dry_run_sweep

    ood = one_class_folder(tmp_path / "far")
    out = tmp_path / "caches"
    cfg = PredictConfig(allow_random_init=True, batch_size=32)
    predict_to_files(RANDOM, digits / "test", out, cfg, dataset_name="test")
    predict_to_files(RANDOM, ood, out, PredictConfig(
        allow_random_init=True, batch_size=32, eval_set="ood-far",
        model_classes=DIGITS), dataset_name="far")
    dry = dry_run_sweep([RANDOM], digits / "test", out, cfg, sets=[f"ood-far={ood}"],
                        probe=False)
    (row,) = dry.models
    assert row["fails"] is None, row["fails"]
    assert len(row["complete"]) == 2 and row["compute"] == []


# -- 2. model kwargs a model does not take ---------------------------------------------------
@pytest.mark.parametrize("arch, shown", [
    ("test_byobnet", "ByoModelCfg.__init__() got an unexpected keyword argument 'foo'"),
    ("uqvision_cnn", "SmallCNN.__init__() got an unexpected keyword argument 'foo'"),
])
def test_train_refuses_a_model_kwarg_the_model_does_not_take_in_one_line(
        digits, tmp_path, capsys, monkeypatch, arch, shown):
    """``--model-kwargs '{"foo": 1}'`` ended in timm's ``TypeError`` traceback once the data
    were read (uqvision_cnn: a ValueError naming no option); now one line naming the option,
    the key and the model, exit 2, before any training (``train_model`` is never called) and
    with nothing written."""
    from uqvision.training import loop

    def trained(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(loop, "train_model", trained)
    code = main(["train", "--arch", arch, "--data", str(digits / "train"), "--out",
                 str(tmp_path / "m.safetensors"), "--input-size", "16", "--epochs", "1",
                 "--model-kwargs", '{"foo": 1, "drop_rate": 0.1}'])
    line = _error_line(capsys)
    assert code == 2
    assert line == (f"uqvision train: error: --model-kwargs {{'foo': 1, 'drop_rate': 0.1}}: "
                    f"timm model {arch!r} takes no keyword argument 'foo' ({shown}"
                    + (" (it takes num_classes, in_chans, width, drop_rate))"
                       if arch == "uqvision_cnn" else ")")), line
    assert list(tmp_path.iterdir()) == []


def test_train_model_refuses_a_model_kwarg_the_model_does_not_take(digits, tmp_path):
    """The library's ``train_model`` (what the reproduction drivers call) refuses an unknown
    key of ``ImageTrainConfig.model_kwargs`` as the command line does: one
    :class:`uqmetrics.InputError` naming ``model_kwargs``, the key and the model, before any
    image is read or file written (it ended in the architecture's ``TypeError`` once the data
    were read)."""
    from uqvision.training import ImageTrainConfig, train_model

    cfg = ImageTrainConfig(arch="test_byobnet", epochs=1, input_size=16,
                           model_kwargs={"foo": 1})
    with pytest.raises(InputError, match=r"^model_kwargs \{'foo': 1\}: timm model "
                                         r"'test_byobnet' takes no keyword argument 'foo'"):
        train_model(digits / "train", tmp_path / "m", cfg)
    assert list(tmp_path.iterdir()) == []


def test_a_sidecars_model_kwarg_the_model_does_not_take_is_named_before_any_image_is_read(
        trained, digits, tmp_path, capsys, monkeypatch):
    """A sidecar whose ``model_kwargs`` hold a key the architecture does not take (edited by
    hand, or written under a timm that took it): one line naming the sidecar, the key and
    the model, from ``uqvision predict`` (exit 2) and from the library (``InputError``),
    before any image is checked or read; for a run of a training method and for a plain
    checkpoint (timm's own load) alike."""
    import importlib

    from uqvision.models import load_model
    from uqvision.training.runs import load_run

    ckpt = tmp_path / "m.safetensors"
    shutil.copy(trained.checkpoint, ckpt)
    side = json.loads(trained.sidecar.read_text())
    ckpt.with_suffix(".json").write_text(json.dumps(
        {**side, "model_kwargs": {**side["model_kwargs"], "foo": 1}}))
    message = (rf"^sidecar '{ckpt.with_suffix('.json')}': model_kwargs \{{.*'foo': 1\}}: timm "
               r"model 'test_byobnet' takes no keyword argument 'foo' \(ByoModelCfg")

    def read(*args, **kwargs):
        raise AssertionError("an image was checked")

    monkeypatch.setattr(importlib.import_module("uqvision.predict.core"), "readable_images",
                        read)
    out = tmp_path / "caches"
    assert main(["predict", "--model", f"test_byobnet={ckpt}", "--data", str(digits / "test"),
                 "--out", str(out)]) == 2
    line = _error_line(capsys).removeprefix("uqvision predict: error: ")
    named = f"--model 'test_byobnet={ckpt}': "  # the option and the value that gave it
    assert line.startswith(named) and re.search(message, line.removeprefix(named)), line
    assert not out.exists()
    with pytest.raises(InputError, match=message):
        predict_to_files(f"test_byobnet={ckpt}", digits / "test", out)
    with pytest.raises(InputError, match=message):
        load_run(f"test_byobnet={ckpt}")
    plain = {k: v for k, v in side.items() if k != "method"}  # no method: timm's own load
    ckpt.with_suffix(".json").write_text(json.dumps(
        {**plain, "model_kwargs": {**side["model_kwargs"], "foo": 1}}))
    with pytest.raises(InputError, match=message):
        load_model(ModelSpec("test_byobnet", str(ckpt)))


def test_only_a_type_error_naming_a_given_key_is_translated(monkeypatch):
    """The meta build translates nothing but a ``TypeError`` saying "unexpected keyword
    argument" for a key the caller gave: the same error for a key of the model's own code (a
    bug there) and any other error propagate as they are; keys the model takes pass."""
    import timm

    from uqvision.models import check_model_kwargs

    check_model_kwargs({"width": 4, "drop_rate": 0.1}, "--model-kwargs", arch="uqvision_cnn")

    def broken(name, **kwargs):
        raise TypeError("Block.__init__() got an unexpected keyword argument 'internal'")

    monkeypatch.setattr(timm, "create_model", broken)
    with pytest.raises(TypeError, match="'internal'"):
        check_model_kwargs({"depth_gap": 1}, "--model-kwargs", arch="uqvision_cnn")
    with pytest.raises(InputError, match="takes no keyword argument 'internal'"):
        check_model_kwargs({"internal": 1}, "--model-kwargs", arch="uqvision_cnn")

    def other(name, **kwargs):
        raise ValueError("width must be >= 1, got 0")

    monkeypatch.setattr(timm, "create_model", other)
    with pytest.raises(ValueError, match="width must be >= 1"):
        check_model_kwargs({"width_gap": 0}, "--model-kwargs", arch="uqvision_cnn")


def test_a_model_that_does_not_build_on_the_meta_device_is_checked_on_the_cpu(monkeypatch):
    """An architecture with an operation that has no meta kernel (some 40 of timm before 1.0.30,
    e.g. ``torch.linspace(...).tolist()``) failed the check with that error; it is built on
    the CPU instead, which takes its own keys and refuses another as the meta build does."""
    import timm
    import torch

    from uqvision.models import check_model_kwargs, checkpoints

    real, devices = timm.create_model, []

    def without_meta_kernel(name, **kwargs):
        devices.append(torch.empty(0).device.type)
        if devices[-1] == "meta":
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
        return real(name, **kwargs)

    monkeypatch.setattr(timm, "create_model", without_meta_kernel)
    monkeypatch.setattr(checkpoints, "_ACCEPTED", set())  # no key set checked before
    check_model_kwargs({"width": 4}, "--model-kwargs", arch="uqvision_cnn")
    assert devices == ["meta", "cpu"]
    with pytest.raises(InputError, match="takes no keyword argument 'foo'"):
        check_model_kwargs({"foo": 1}, "--model-kwargs", arch="uqvision_cnn")
    assert devices == ["meta", "cpu"] * 2


# -- 3. the BatchNorm folder of a SWAG run, hashed once per command --------------------------
def _swag(digits, root: Path) -> tuple[str, Path]:
    """A SWAG run of test_byobnet (its samples recompute their BatchNorm statistics) trained
    on a copy of the digits train folder; returns its spec and that folder."""
    from uqvision.training.loop import ImageTrainConfig, train_model

    train = root / "train"
    shutil.copytree(digits / "train", train)
    hp = {"batch_size": "16", "pretrain_epochs": "1", "swag_epochs": "1",
          "collect_epochs": "0.25", "rank": "3"}
    ckpt = train_model(train, root / "swag.safetensors", ImageTrainConfig(
        arch="test_byobnet", method="swag", input_size=16, seed=0, hparams=hp)).checkpoint
    return f"test_byobnet={ckpt}", train


def _reads_of(folder: Path) -> dict[str, int]:
    """How often this process read each image of ``folder`` to hash it since the counter
    was cleared (:data:`uqvision.data.folders.HASH_READS`)."""
    root = folder.resolve()
    return {k: n for k, n in folders_module.HASH_READS.items()
            if Path(k).resolve().is_relative_to(root)}


def test_one_command_hashes_the_batchnorm_folder_once_and_sees_it_changed_in_place(
        digits, tmp_path):
    """A resumed SWAG prediction (a cache there, one to compute) hashed every image of its
    BatchNorm folder twice: once to check the cache there, once for the caches it writes.
    Now once per command (the checks and the prediction share the folder's scan); a second
    command scans it again, so an image replaced in place between the two is refused
    naming ``train_data_fingerprint``."""
    from uqvision.data import dataset_fingerprint

    spec, train = _swag(digits, tmp_path)
    n = sum(1 for _ in train.rglob("*.png"))
    out = tmp_path / "caches"
    cfg = PredictConfig(samples=2, batch_size=32)
    first, second = predict_to_files(spec, digits / "test", out, cfg)
    second.unlink()
    folders_module.HASH_READS.clear()
    assert predict_to_files(spec, digits / "test", out, cfg) == [first, second]
    reads = _reads_of(train)
    assert len(reads) == n and set(reads.values()) == {1}, sorted(set(reads.values()))
    want = dataset_fingerprint(train)
    assert {read_cache(p).attrs["train_data_fingerprint"] for p in (first, second)} == {want}
    before = _hashes(out)
    image = min((train / "3").iterdir())
    shutil.copyfile(min((train / "5").iterdir()), image)  # another image, same name
    with pytest.raises(InputError, match=r"train_data_fingerprint '"):
        predict_to_files(spec, digits / "test", out, cfg)
    assert _hashes(out) == before


@pytest.fixture(scope="module")
def client():
    """An in-process Dask cluster: the cells run in this process, where reads are counted."""
    from dask.distributed import Client, LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_a_sweep_hashes_the_batchnorm_folder_once_in_its_plan(digits, tmp_path, client,
                                                               one_class_folder):
    """A sweep of a SWAG run over two folders (its ``--data`` and an OOD set), one sample of
    each cached, one to compute, hashed its BatchNorm folder in its plan's check of each
    folder's caches, then again in every cell: 2 + 2 reads of each image. Now the plan hashes
    it once for every folder and gives its fingerprint to the cells, as it does the
    predicted folders'; the caches record it."""
    from uqvision.data import dataset_fingerprint
    from uqvision.sweep import sweep_predictions

    spec, train = _swag(digits, tmp_path)
    ood = one_class_folder(tmp_path / "far")
    n = sum(1 for _ in train.rglob("*.png"))
    out = tmp_path / "caches"
    cfg = PredictConfig(samples=2, batch_size=32, num_workers=0)
    one = dataclasses.replace(cfg, samples=1)  # sample 0 of each folder there: checked
    predict_to_files(spec, digits / "test", out, one, dataset_name="test")
    predict_to_files(spec, ood, out, dataclasses.replace(one, eval_set="ood-far"),
                     dataset_name="far")
    folders_module.HASH_READS.clear()
    report = sweep_predictions([spec], digits / "test", out, cfg, client=client,
                               sets=[f"ood-far={ood}"])
    assert report.failed == {} and len(report.computed) == 2 and len(report.skipped) == 2
    reads = _reads_of(train)
    assert len(reads) == n and set(reads.values()) == {1}, sorted(set(reads.values()))
    want = dataset_fingerprint(train)
    assert {read_cache(p).attrs["train_data_fingerprint"] for p in report.computed} == {want}
