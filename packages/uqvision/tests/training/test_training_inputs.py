"""``uqvision train`` and :func:`load_run` at their boundaries: a user's mistake is one line
naming the option and value, with nothing written; a sidecar is data (its timm kwargs fetch no
weights, its state file lies beside the checkpoint); an interrupted ``--overwrite`` never leaves
the earlier run's weights under the new run's sidecar."""

import json
import shutil

import pytest
import safetensors.torch
import timm.models._builder
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.models import ModelSpec, load_model
from uqvision.training.loop import ImageTrainConfig, train_model
from uqvision.training.method import TRAINING_METHODS
from uqvision.training.runs import load_run, run_matches


def _refused(capsys, argv):
    """Run the command line; assert exit code 2 and one line on stderr; return that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


def test_an_overwrite_killed_while_saving_leaves_no_checkpoint_of_the_earlier_run(
        digits, tmp_path, monkeypatch):
    """The sidecar was written first and the checkpoint second: a kill in between left the
    earlier run's weights under the new run's sidecar, which ``run_matches`` then took for the
    new run (a reproduction kept it)."""
    cfg = {"arch": "test_vit", "epochs": 1, "input_size": 16, "batch_size": 64}
    first, second = ImageTrainConfig(**cfg, seed=0), ImageTrainConfig(**cfg, seed=1)
    train_model(digits / "train", tmp_path / "m", first)
    (tmp_path / "m.state.safetensors").write_bytes(b"an earlier method's state")
    save = safetensors.torch.save_file

    def killed(tensors, filename, *args, **kwargs):
        if "state" not in str(filename):  # the process dies while writing the new weights
            raise KeyboardInterrupt
        return save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        train_model(digits / "train", tmp_path / "m", second, overwrite=True)
    assert not (tmp_path / "m.safetensors").exists()
    assert not (tmp_path / "m.state.safetensors").exists()
    assert not run_matches(tmp_path / "m.safetensors", second)
    assert not run_matches(tmp_path / "m.safetensors", first)


@pytest.mark.parametrize("pair", ["epochs=inf", "lr_init=inf", "weight_decay=inf"])
def test_set_refuses_a_hyper_parameter_that_is_not_finite(digits, tmp_path, capsys, pair):
    """``--set epochs=inf`` ended in an OverflowError traceback; ``lr_init=inf`` or
    ``weight_decay=inf`` trained and saved a network of NaNs (``--lr inf`` is refused)."""
    key = pair.partition("=")[0]
    with pytest.raises(ValueError, match=f"{key} must be a finite number, got inf"):
        TRAINING_METHODS.lookup("deep_ensemble").hparams_from([pair])
    line = _refused(capsys, ["train", "--arch", "test_vit", "--data", str(digits / "train"),
                             "--out", str(tmp_path / "m.safetensors"), "--input-size", "16",
                             "--set", pair])
    assert f"{key} must be a finite number, got inf" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    (["--out", "{tmp}/m{{}}.safetensors"], "--out '{tmp}/m{{}}.safetensors': only '{{seed}}'"),
    (["--out", "{tmp}/m{{run}}.safetensors"], "--out '{tmp}/m{{run}}.safetensors': only"),
    (["--out", "{tmp}/runs/"], "--out '{tmp}/runs/' is a folder"),
    (["--model-kwargs", "[1]"], "--model-kwargs must be an object of keyword arguments"),
    (["--model-kwargs", '{{"pretrained": true}}'],
     "--model-kwargs {{'pretrained': True}} names ['pretrained']"),
    (["--drop-rate", "nan"], "argument --drop-rate: must be a finite number >= 0, got nan"),
    (["--drop-rate", "2"], "argument --drop-rate: must be a probability (0 to 1), got 2"),
    (["--seeds", str(2**64)], ("argument --seeds: must be <= 9223372036854775807 (a seed is a "
                               "signed 64-bit integer), got 18446744073709551616")),
])
def test_train_options_are_refused_in_one_line_naming_them(digits, tmp_path, capsys, options,
                                                           message):
    """These ended in a traceback (IndexError, KeyError, TypeError, RuntimeError), except
    ``--out FOLDER/``, which wrote ``FOLDER.safetensors`` beside the folder,
    ``{"pretrained": true}``, which fetched timm's pretrained weights to train from,
    ``--drop-rate 2``, refused by timm in a line that named no option, and a seed beyond 64
    bits, refused as "Overflow when unpacking long long" (every seed option has that bound)."""
    (tmp_path / "runs").mkdir()
    options = [o.format(tmp=tmp_path) for o in options]
    if "--out" not in options:
        options += ["--out", str(tmp_path / "runs" / "m.safetensors")]
    line = _refused(capsys, ["train", "--arch", "test_vit", "--data", str(digits / "train"),
                             "--input-size", "16", "--epochs", "1", *options])
    assert message.format(tmp=tmp_path) in line
    assert [p.name for p in tmp_path.rglob("*")] == ["runs"]  # nothing written


def test_a_sidecar_fetches_no_weights_and_names_its_state_file_beside_the_checkpoint(
        trained, tmp_path, monkeypatch):
    """A sidecar's ``model_kwargs`` went to ``timm.create_model`` as they were:
    ``{"pretrained": true}`` fetched weights from the hub, ``checkpoint_path`` read a file
    elsewhere; its ``state_file`` was read wherever it pointed (an absolute path)."""

    def fetched(*args, **kwargs):
        raise AssertionError("a sidecar made timm fetch pretrained weights")

    monkeypatch.setattr(timm.models._builder, "load_pretrained", fetched)
    ckpt = tmp_path / "m.safetensors"
    shutil.copy(trained.checkpoint, ckpt)
    side = json.loads(trained.sidecar.read_text())
    for kwargs in ({"pretrained": True}, {"checkpoint_path": str(trained.checkpoint)}):
        ckpt.with_suffix(".json").write_text(json.dumps(
            {**side, "model_kwargs": {**side["model_kwargs"], **kwargs}}))
        with pytest.raises(InputError, match=rf"sidecar '.*m\.json': model_kwargs .* names "
                                             rf"\['{next(iter(kwargs))}'\]"):
            load_run(f"test_byobnet={ckpt}")
    # the plain checkpoint path (timm's source) lays the sidecar's kwargs over its own overlay:
    # {"pretrained_cfg_overlay": {"hf_hub_id": ...}} would load another file than the checkpoint
    ckpt.with_suffix(".json").write_text(json.dumps({**side, "model_kwargs": {
        **side["model_kwargs"], "pretrained_cfg_overlay": {"hf_hub_id": "timm/resnet18.a1_in1k"}}}))
    with pytest.raises(InputError, match=r"sidecar '.*m\.json': model_kwargs .* names "
                                         r"\['pretrained_cfg_overlay'\]"):
        load_model(ModelSpec("test_byobnet", str(ckpt)))
    ckpt.with_suffix(".json").write_text(json.dumps({**side, "state_file": str(ckpt)}))
    with pytest.raises(InputError, match=r"its 'state_file' must be a file name beside"):
        load_run(f"test_byobnet={ckpt}")
    ckpt.with_suffix(".json").write_text(json.dumps(side))
    assert load_run(f"test_byobnet={ckpt}").state is not None  # the sidecar as written


def test_a_reproduction_retrains_a_run_whose_training_images_changed(digits, tmp_path):
    """A driver's run (:func:`uqvision.protocols.base.train_and_predict`) is kept only when its
    sidecar records its config and the images it trains on: the same config on a folder whose
    image changed in place (or another folder) retrains it. Before, ``run_matches`` compared
    the config alone, and the run trained on the earlier images was kept."""
    from uqvision.data import dataset_fingerprint
    from uqvision.models import read_sidecar
    from uqvision.protocols.base import train_and_predict

    cfg = ImageTrainConfig(arch="test_vit", epochs=1, input_size=16, batch_size=64)
    train = tmp_path / "train"
    shutil.copytree(digits / "train", train)
    models = tmp_path / "models"
    models.mkdir()
    trained = []

    def run() -> None:
        train_and_predict([("r", cfg, {})], models, train,
                          lambda spec, how, now: trained.append(now) or 0, log=lambda line: None)

    run()
    run()  # the same config and images: kept
    assert trained == [True, False]
    first, second = sorted(train.rglob("*.png"))[:2]
    first.write_bytes(second.read_bytes())  # one image replaced in place, names unchanged
    run()
    assert trained == [True, False, True]
    assert read_sidecar(models / "r.safetensors")["dataset_fingerprint"] == dataset_fingerprint(train)
