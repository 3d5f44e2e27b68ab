import dataclasses
import json

import pytest
import timm
import torch

from uqvision.data import ImageFolderDataset
from uqvision.models import load_model, read_sidecar
from uqvision.training.loop import ImageTrainConfig, train_model


def _batch(digits, loaded):
    ds = ImageFolderDataset(digits / "test", loaded.transform)
    return torch.stack([ds[i][0] for i in range(16)])


def test_checkpoint_reloads_through_timm_to_identical_logits(trained, digits):
    side = read_sidecar(trained.checkpoint)
    assert side["architecture"] == "test_byobnet" and side["num_classes"] == 10
    # plain timm, its own pretrained-file mechanism, head kept
    reloaded = timm.create_model(
        "test_byobnet", pretrained=True, num_classes=10, **side["model_kwargs"],
        pretrained_cfg_overlay=dict(file=str(trained.checkpoint), num_classes=10,
                                    **side["pretrained_cfg"])).eval()
    loaded = load_model(f"test_byobnet={trained.checkpoint}", num_classes=10)
    x = _batch(digits, loaded)
    with torch.no_grad():
        ref = trained.model.eval()(x)
        assert torch.equal(reloaded(x), ref)
        assert torch.equal(loaded.model(x), ref)
    # the preprocessing the model was trained with comes back from its pretrained config
    assert loaded.data_config.input_size == (3, 16, 16)
    assert tuple(reloaded.pretrained_cfg["input_size"]) == (3, 16, 16)


def test_training_learns_and_records_its_config(trained):
    assert trained.losses[-1] < trained.losses[0]
    side = json.loads(trained.sidecar.read_text())
    assert side["train_config"]["seed"] == 0 and side["dataset_fingerprint"]
    assert side["classes"] == [str(d) for d in range(10)]


def test_same_seed_same_weights_other_seed_other_weights(digits, tmp_path):
    cfg = {"arch": "test_vit", "epochs": 1, "input_size": 16, "batch_size": 32}
    a = train_model(digits / "train", tmp_path / "a", ImageTrainConfig(**cfg, seed=3))
    b = train_model(digits / "train", tmp_path / "b", ImageTrainConfig(**cfg, seed=3))
    c = train_model(digits / "train", tmp_path / "c", ImageTrainConfig(**cfg, seed=4))
    assert a.checkpoint.suffix == ".safetensors"
    sa, sb, sc = (r.model.state_dict() for r in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_train_rejects_tags_and_unknown_archs(digits, tmp_path):
    with pytest.raises(ValueError, match="pretrained tag"):
        train_model(digits / "train", tmp_path / "x", ImageTrainConfig(arch="resnet10t.c3_in1k"))
    with pytest.raises(ValueError, match="did you mean"):
        train_model(digits / "train", tmp_path / "x", ImageTrainConfig(arch="resnet10tt"))


def test_a_failed_save_leaves_no_temporary_file(digits, tmp_path, monkeypatch):
    import safetensors.torch

    def boom(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        train_model(digits / "train", tmp_path / "m", ImageTrainConfig(
            arch="test_vit", epochs=1, input_size=16, batch_size=64))
    assert not (tmp_path / "m.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]  # nothing half-written


# -- the one loop over the method hooks (issue 10, item 2) ----------------------------------
def test_a_method_run_records_its_cost_and_state_and_reloads_its_samples(digits, tmp_path):
    from uqvision.training.loop import state_path
    from uqvision.training.runs import load_run

    cfg = ImageTrainConfig(arch="test_vit", method="sse", input_size=16, seed=1,
                      hparams={"cycles": "2", "cycle_epochs": "1", "batch_size": "32"})
    r = train_model(digits / "train", tmp_path / "sse", cfg)
    side = json.loads(r.sidecar.read_text())
    assert side["format"] == "uqvision.checkpoint/2" and side["method"] == "sse"
    assert side["hparams"]["cycles"] == 2 and side["hparams"]["lr0"] == 0.2
    steps = 2 * (65 // 32)  # two cycles of one epoch, the last incomplete batch dropped
    cost = side["cost"]
    assert cost["steps"] == r.steps == steps and cost["epochs"] == 2.0 == r.epochs
    assert cost["wall_time_s"] > 0 and cost["total_epochs"] == 2.0
    assert [s["step"] for s in side["state_meta"]["snapshots"]] == [2, 4]
    assert r.state_file == state_path(r.checkpoint) and r.state_file.is_file()
    run = load_run(f"test_vit={r.checkpoint}")
    assert run.method == "sse" and run.seed == 1 and run.default_samples() == 2
    assert run.state.bn_loader is None  # SSE never recomputes BatchNorm: no folder read
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        a, b = (net(x).clone() for net in run.samples(2, 0))
        last = r.model.eval()(x)
    assert not torch.equal(a, b)  # two snapshots
    torch.testing.assert_close(b, last)  # the last snapshot is the final network


def test_the_former_adamw_recipe_is_reachable(digits, tmp_path):
    from uqvision.training.loop import ADAMW_RECIPE
    from uqvision.training.schedules import one_cycle_lr

    r = train_model(digits / "train", tmp_path / "adamw", ImageTrainConfig(
        arch="test_vit", input_size=16, epochs=2, batch_size=32, hparams=ADAMW_RECIPE))
    assert isinstance(r.state.optimizer, torch.optim.AdamW)
    assert r.state.optimizer.param_groups[0]["weight_decay"] == 0.05
    assert r.state.lr == pytest.approx(one_cycle_lr(r.steps - 1, r.steps, 3e-3))
    default = ImageTrainConfig(epochs=1).method_hparams()
    assert (default.optimizer, default.schedule, default.lr_init) == ("sgd", "linear_decay", 0.1)


def test_shorthands_name_the_method_field_or_refuse(digits):
    assert ImageTrainConfig(method="sse", lr=0.05).method_hparams().lr0 == 0.05
    assert ImageTrainConfig(method="fge", lr=0.05).method_hparams().lr_init == 0.05
    with pytest.raises(ValueError, match="epochs=3 does not apply to method 'sse'"):
        ImageTrainConfig(method="sse", epochs=3).method_hparams()
    with pytest.raises(ValueError, match="unknown hyper-parameter 'cycle'"):
        ImageTrainConfig(method="sse", hparams={"cycle": "3"}).method_hparams()


def test_start_from_a_checkpoint_cumulates_its_cost(trained, digits, tmp_path):
    """K-FAC Laplace around a trained network: 0 epochs from the checkpoint keep its
    weights; the cost adds the checkpoint's own."""
    cfg = ImageTrainConfig(arch="test_byobnet", method="kfac_laplace", input_size=16,
                      drop_rate=0.2, init_checkpoint=str(trained.checkpoint),
                      hparams={"epochs": "0", "scales": "0.1", "batch_size": "32"})
    r = train_model(digits / "train", tmp_path / "laplace", cfg)
    before = trained.model.state_dict()
    assert all(torch.equal(v, before[k]) for k, v in r.model.state_dict().items())
    side = json.loads(r.sidecar.read_text())
    init = json.loads(trained.sidecar.read_text())["cost"]
    assert side["cost"]["steps"] == 0 and side["cost"]["total_steps"] == init["steps"]
    assert side["cost"]["total_epochs"] == init["total_epochs"] == 2.0
    assert side["init_sha256"] and float(r.state.extra["laplace.scale"]) == 0.1
    # its samples recompute BatchNorm statistics (bn_update): a loader over the run's own
    # training images; with bn_update off, none
    from uqvision.training.runs import load_run

    run = load_run(f"test_byobnet={r.checkpoint}")
    assert len(run.state.bn_loader.dataset) == len(ImageFolderDataset(digits / "train"))
    off = train_model(digits / "train", tmp_path / "laplace_off", dataclasses.replace(
        cfg, hparams={**cfg.hparams, "bn_update": "false"}))
    assert load_run(f"test_byobnet={off.checkpoint}").state.bn_loader is None
    # no training folder: refused (naming the folder and the option), never silently kept at
    # the final iterate's statistics; the explicit opt-out (bn_update=false, recorded in the
    # sidecar's hyper-parameters) needs none
    from uqmetrics import InputError

    missing = tmp_path / "moved_away"
    with pytest.raises(InputError, match=r"moved_away.*--train-data"):
        load_run(f"test_byobnet={r.checkpoint}", train_data=missing)
    side_off = json.loads(off.sidecar.read_text())
    assert side_off["hparams"]["bn_update"] is False
    assert load_run(f"test_byobnet={off.checkpoint}", train_data=missing).state.bn_loader is None


def test_training_is_a_function_of_the_seed_and_leaves_the_callers_rng(digits, tmp_path):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    cfg = ImageTrainConfig(arch="test_vit", input_size=16, epochs=1, batch_size=16, seed=2)
    a = train_model(digits / "train", tmp_path / "a", cfg)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(7)  # another caller state: the same network
    b = train_model(digits / "train", tmp_path / "b", cfg)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_cli_trains_a_method_with_set_options_and_predicts_its_samples(digits, tmp_path, capsys):
    from uqvision.cache import read_cache
    from uqvision.cli import main

    ckpt = tmp_path / "fge.safetensors"
    assert main(["--threads", "1", "train", "--arch", "test_vit", "--data",
                 str(digits / "train"), "--out", str(ckpt), "--method", "fge", "--input-size",
                 "16", "--set", "pretrain_epochs=1", "--set", "cycles=2", "--set",
                 "cycle_epochs=0.5", "--batch-size", "16"]) == 0
    assert "fge" in capsys.readouterr().out
    assert json.loads(ckpt.with_suffix(".json").read_text())["hparams"]["cycles"] == 2
    assert main(["predict", "--model", f"test_vit={ckpt}", "--data", str(digits / "test"),
                 "--out", str(tmp_path / "c"), "--samples", "2"]) == 0
    caches = sorted((tmp_path / "c").glob("*.nc"))
    assert [read_cache(p).attrs["sample_index"] for p in caches] == [0, 1]
    capsys.readouterr()
    assert main(["train", "--arch", "test_vit", "--data", str(digits / "train"), "--out",
                 str(tmp_path / "x"), "--method", "fge", "--set", "cycles"]) == 2
    assert "--set expects key=value" in capsys.readouterr().err


# -- class-subset views and spectral normalisation (UIMNET, issue 11) -----------------------
def test_a_class_view_with_an_index_file_trains_on_those_images_only(digits, tmp_path):
    """``classes`` + ``index_file``: the head has the view's classes, each epoch's batches
    cover exactly the indexed images (positions of the class view), and a mapping groups
    folder classes into labels."""
    from uqvision.data import image_view, read_index_file
    from uqvision.protocols.uimnet.index import make_index_files
    from uqvision.training.loop import _train_loader

    classes = ("7", "2", "5")
    paths = make_index_files(digits / "train", classes, tmp_path / "index", seed=0)
    cfg = ImageTrainConfig(arch="uqvision_cnn", method="erm", epochs=1, batch_size=8, input_size=16,
                      model_kwargs={"width": 4}, classes=classes,
                      index_file=str(paths["train"]))
    run = train_model(digits / "train", tmp_path / "m", cfg)
    side = read_sidecar(run.checkpoint)
    assert side["classes"] == list(classes) and side["num_classes"] == 3
    assert side["train_config"]["classes"] == list(classes)
    view = image_view(digits / "train", None, classes=classes, index_file=paths["train"])
    wanted = read_index_file(paths["train"])["samples"]
    assert view.sample_ids == wanted
    folder = ImageFolderDataset(digits / "train")
    assert [folder.classes[folder.targets[folder.sample_ids.index(s)]] for s in wanted] == [
        classes[y] for y in view.targets]
    loader, _ = _train_loader(view, cfg, 8, 0, 1, 0)
    seen = sorted(int(i) for batch in loader.batch_sampler for i in batch)
    assert len(seen) == 8 * (len(view) // 8) and len(set(seen)) == len(seen)
    grouped = image_view(digits / "train", None, classes={"1": "odd", "2": "even", "3": "odd"})
    assert grouped.classes == ["odd", "even"]
    assert sorted(set(grouped.targets)) == [0, 1]
    with pytest.raises(ValueError, match="indexes classes"):
        image_view(digits / "train", None, classes=("2", "7", "5"), index_file=paths["train"])


def test_cli_trains_on_a_class_view_an_index_file_and_spectral(digits, tmp_path, capsys):
    """``uqvision train --classes --index-file --spectral`` reach ImageTrainConfig: the sidecar
    records them and the network is the library's; an index file alone brings its classes;
    malformed --classes names the option."""
    from safetensors.torch import load_file

    from uqvision.cli import main
    from uqvision.protocols.uimnet.index import make_index_files

    classes = ("7", "2", "5")
    paths = make_index_files(digits / "train", classes, tmp_path / "index", seed=0)
    base = ["--threads", "1", "train", "--arch", "uqvision_cnn", "--data", str(digits / "train"),
            "--method", "erm", "--epochs", "1", "--batch-size", "8", "--input-size", "16",
            "--model-kwargs", '{"width": 4}']
    assert main([*base, "--out", str(tmp_path / "a"), "--classes", "7,2,5", "--index-file",
                 str(paths["train"]), "--spectral"]) == 0
    lib = train_model(digits / "train", tmp_path / "b", ImageTrainConfig(
        arch="uqvision_cnn", method="erm", epochs=1, batch_size=8, input_size=16,
        model_kwargs={"width": 4}, classes=classes, index_file=str(paths["train"]),
        spectral=True))
    side = read_sidecar(tmp_path / "a.safetensors")
    assert side["classes"] == list(classes) and side["train_config"]["spectral"] is True
    assert side["train_config"]["index_file"] == str(paths["train"])
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(lib.checkpoint))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the index file alone: its recorded classes; a JSON mapping groups classes
    assert main([*base, "--out", str(tmp_path / "c"), "--index-file", str(paths["train"])]) == 0
    assert read_sidecar(tmp_path / "c.safetensors")["classes"] == list(classes)
    mapping = tmp_path / "groups.json"
    mapping.write_text(json.dumps({"1": "odd", "2": "even", "3": "odd"}))
    assert main([*base, "--out", str(tmp_path / "d"), "--classes", str(mapping)]) == 0
    assert read_sidecar(tmp_path / "d.safetensors")["classes"] == ["odd", "even"]
    capsys.readouterr()
    for bad, message in (("7,,5", "--classes expects class names"),
                         (str(tmp_path / "missing.json"), "--classes"),):
        assert main([*base, "--out", str(tmp_path / "e"), "--classes", bad]) == 2
        assert message in capsys.readouterr().err


def test_spectral_training_parametrizes_the_featurizer_and_reloads_to_identical_logits(digits,
                                                                                 tmp_path):
    from torch.nn.utils import parametrize

    from uqvision.training.runs import load_run

    cfg = ImageTrainConfig(arch="uqvision_cnn", method="erm", epochs=1, batch_size=16,
                      input_size=16, model_kwargs={"width": 4}, spectral=True,
                      classes=("0", "1", "2"))
    run = train_model(digits / "train", tmp_path / "sn", cfg)
    net = run.model.eval()
    convs = [m for m in net.backbone.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(parametrize.is_parametrized(m, "weight") for m in convs)
    assert not parametrize.is_parametrized(net.classifier, "weight")
    bns = [m for m in net.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(parametrize.is_parametrized(m, "weight") for m in bns)
    again = load_run(f"uqvision_cnn={run.checkpoint}", num_classes=3)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(again.loaded.model.eval()(x), net(x))


def test_a_student_matches_its_run_by_its_teachers_weights_not_their_paths(trained, digits,
                                                                           tmp_path):
    """A distilled student's sidecar records its teachers' weights (SHA-256): a run folder
    moved elsewhere still matches its config (before, the teachers' absolute paths differed
    and a moved reproduction retrained every student), while a teacher retrained in place no
    longer does (before, the same path matched)."""
    import shutil

    from uqvision.models import file_sha256
    from uqvision.training.runs import run_matches

    teacher = tmp_path / "old" / "teacher.safetensors"
    teacher.parent.mkdir()
    for f in (trained.checkpoint, trained.sidecar):
        shutil.copy(f, teacher.parent / f.name.replace("m0", "teacher"))
    cfg = {"arch": "test_byobnet", "epochs": 1, "input_size": 16, "batch_size": 32, "seed": 0}
    student = train_model(digits / "train", tmp_path / "old" / "student", ImageTrainConfig(
        **cfg, teachers=(f"test_byobnet={teacher}",))).checkpoint
    assert read_sidecar(student)["teachers_sha256"] == [file_sha256(teacher)]
    assert run_matches(student, ImageTrainConfig(**cfg, teachers=(f"test_byobnet={teacher}",)))

    moved = tmp_path / "new"
    shutil.move(tmp_path / "old", moved)
    now = f"test_byobnet={moved / 'teacher.safetensors'}"
    assert run_matches(moved / student.name, ImageTrainConfig(**cfg, teachers=(now,)))
    other_name = f"test_vit={moved / 'teacher.safetensors'}"
    assert not run_matches(moved / student.name, ImageTrainConfig(**cfg, teachers=(other_name,)))
    assert not run_matches(moved / student.name, ImageTrainConfig(**cfg))  # no teacher
    assert not run_matches(moved / student.name, ImageTrainConfig(**{**cfg, "seed": 1},
                                                                  teachers=(now,)))

    train_model(digits / "train", moved / "teacher", ImageTrainConfig(**cfg))  # retrained
    assert not run_matches(moved / student.name, ImageTrainConfig(**cfg, teachers=(now,)))


def test_a_fine_tuned_run_no_longer_matches_once_its_start_is_retrained(trained, digits,
                                                                         tmp_path):
    """A run fine-tuned from a checkpoint (``init_checkpoint``: URL's methods from their
    backbone, a disentanglement head from its first member) matches its config only while
    that checkpoint holds the weights it started from: one retrained in place (same path, so
    the same config) retrains the run (before, it was reused, fine-tuned from the old
    weights)."""
    import shutil

    from uqvision.training.runs import run_matches

    start = tmp_path / "start.safetensors"
    shutil.copy(trained.checkpoint, start)
    shutil.copy(trained.sidecar, tmp_path / trained.sidecar.name.replace("m0", "start"))
    cfg = ImageTrainConfig(arch="test_byobnet", epochs=1, input_size=16, batch_size=32, seed=0,
                           init_checkpoint=str(start))
    tuned = train_model(digits / "train", tmp_path / "tuned", cfg).checkpoint
    assert run_matches(tuned, cfg)
    train_model(digits / "train", start, ImageTrainConfig(
        arch="test_byobnet", epochs=1, input_size=16, batch_size=32, seed=1))  # retrained
    assert not run_matches(tuned, cfg)


class _Payload:
    """Pickles as a call that writes ``marker``: a weight file that runs code when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).write_text, (self.marker, "ran"))


def test_a_pickled_init_checkpoint_never_runs_code(trained, digits, tmp_path):
    """``init_checkpoint`` (``train --init``, possibly from a received config) is read tensors
    only, whatever timm's default (``weights_only=False`` before timm 1.0.26): the payload never
    runs, and the refusal is one line naming the file (before: timm's raw traceback)."""
    from uqvision.exceptions import CheckpointError

    marker = tmp_path / "ran"
    theirs = tmp_path / "theirs.pth"
    state = load_model(f"test_byobnet={trained.checkpoint}").model.state_dict()
    torch.save({**state, "payload": _Payload(marker)}, theirs)
    cfg = ImageTrainConfig(arch="test_byobnet", epochs=1, input_size=16, batch_size=32, seed=0,
                           init_checkpoint=str(theirs))
    with pytest.raises(CheckpointError) as info:
        train_model(digits / "train", tmp_path / "tuned", cfg)
    assert not marker.exists()
    text = str(info.value)
    assert "\n" not in text and f"checkpoint {str(theirs)!r} does not load" in text
    assert not (tmp_path / "tuned.safetensors").exists()
