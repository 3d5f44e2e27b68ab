"""Checkpoint files and their sidecars (:mod:`uqvision.models.checkpoints`): writing, the cheap
checks before a load, the sidecar's class names and the errors that name the file."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from uqmetrics import InputError

from uqvision.exceptions import CheckpointError
from uqvision.models import (
    ModelSpec,
    check_checkpoint_file,
    existing_checkpoint,
    read_sidecar,
    recorded_class_names,
    sidecar_path,
    write_checkpoint,
)
from uqvision.models.checkpoints import _check_head, _class_names, _tensor_shapes


def test_write_checkpoint_writes_the_state_and_its_sidecar(tmp_path):
    net = torch.nn.Linear(4, 3)
    path = write_checkpoint(net, tmp_path / "net.safetensors", {"classes": ["a", "b", "c"]})
    assert sidecar_path(path) == tmp_path / "net.json"
    state = safetensors.torch.load_file(str(path))
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert read_sidecar(path) == {"classes": ["a", "b", "c"]}
    assert recorded_class_names(path) == ("a", "b", "c")
    assert existing_checkpoint(ModelSpec("x", str(path))) == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json", "net.safetensors"]
    shapes = _tensor_shapes(str(path))  # shapes from the header, no data read
    assert {k: tuple(v.shape) for k, v in shapes.items()} == {"weight": (3, 4), "bias": (3,)}
    assert all(v.device.type == "meta" for v in shapes.values())


def test_damaged_files_are_named_before_loading(tmp_path):
    path = write_checkpoint(torch.nn.Linear(4, 3), tmp_path / "net.safetensors", {})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"cut.safetensors.*truncated"):
        check_checkpoint_file(cut)
    (tmp_path / "empty.pth").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pth': empty file"):
        check_checkpoint_file(tmp_path / "empty.pth")
    (tmp_path / "text.pth").write_text("hello")
    with pytest.raises(CheckpointError, match="not a PyTorch weight file"):
        check_checkpoint_file(tmp_path / "text.pth")
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pth")
    check_checkpoint_file(tmp_path / "ok.pth")
    with pytest.raises(FileNotFoundError, match="absent.pth' does not exist"):
        existing_checkpoint(ModelSpec("x", str(tmp_path / "absent.pth")))


@pytest.mark.parametrize("text, match", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    (json.dumps({"method": "erm", "architecture": "a"}), "names a training method but lacks"),
])
def test_a_bad_sidecar_is_named(tmp_path, text, match):
    (tmp_path / "w.json").write_text(text)
    with pytest.raises(CheckpointError, match=match):
        read_sidecar(tmp_path / "w.safetensors")


@pytest.mark.parametrize("side, match", [
    ({"classes": "abc"}, "'classes' must be a list of class names, got str"),
    ({"classes": ["a", "a"]}, "names a class more than once"),
    ({"classes": ["a", "b"], "num_classes": 3}, "names 2 classes but 'num_classes' is 3"),
])
def test_recorded_class_names_are_checked(tmp_path, side, match):
    (tmp_path / "w.json").write_text(json.dumps(side))
    with pytest.raises(InputError, match=match):
        recorded_class_names(tmp_path / "w.safetensors")


def test_class_names_come_from_the_sidecar_else_imagenet(tmp_path):
    assert recorded_class_names(None) is None and read_sidecar(tmp_path / "none.pth") == {}
    ckpt = str(tmp_path / "w.pth")
    assert _class_names(ckpt, 1000, in1k=True)[1] == "imagenet-1k"
    assert _class_names(ckpt, 1000, in1k=False) == (None, "")
    assert _class_names(ckpt, 10, in1k=True) == (None, "")
    (tmp_path / "w.json").write_text(json.dumps({"classes": ["a", "b"]}))
    assert _class_names(ckpt, 2, in1k=True) == (("a", "b"), "sidecar")
    with pytest.raises(InputError, match="names 2 classes but checkpoint .* has a 3-class head"):
        _class_names(ckpt, 3, in1k=False)


def test_the_head_check_names_the_file_and_both_class_counts():
    state = {"fc.weight": torch.empty(7, 4)}
    assert _check_head(state, ["head.weight", "fc.weight"], None, "w.pth") == 7
    with pytest.raises(ValueError, match=r"'w.pth' has a 7-class head \(fc.weight of shape "
                                         r"\(7, 4\)\) but the dataset has 10 classes"):
        _check_head(state, ["fc.weight"], 10, "w.pth")
    with pytest.raises(ValueError, match="has no classifier weight"):
        _check_head(state, ["head.weight"], None, "w.pth")
