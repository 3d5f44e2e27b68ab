import json

import pytest
import timm
import torch

from uqvision.data import ImageFolderDataset
from uqvision.models import load_model, read_sidecar
from uqvision.train import TrainConfig, train_model


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
    a = train_model(digits / "train", tmp_path / "a", TrainConfig(**cfg, seed=3))
    b = train_model(digits / "train", tmp_path / "b", TrainConfig(**cfg, seed=3))
    c = train_model(digits / "train", tmp_path / "c", TrainConfig(**cfg, seed=4))
    assert a.checkpoint.suffix == ".safetensors"
    sa, sb, sc = (r.model.state_dict() for r in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_train_rejects_tags_and_unknown_archs(digits, tmp_path):
    with pytest.raises(ValueError, match="pretrained tag"):
        train_model(digits / "train", tmp_path / "x", TrainConfig(arch="resnet10t.c3_in1k"))
    with pytest.raises(ValueError, match="did you mean"):
        train_model(digits / "train", tmp_path / "x", TrainConfig(arch="resnet10tt"))


def test_a_failed_save_leaves_no_temporary_file(digits, tmp_path, monkeypatch):
    import safetensors.torch

    def boom(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        train_model(digits / "train", tmp_path / "m", TrainConfig(
            arch="test_vit", epochs=1, input_size=16, batch_size=64))
    assert not (tmp_path / "m.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]  # nothing half-written
