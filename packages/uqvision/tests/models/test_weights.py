"""Pretrained weights by name, through the real caches with no network and nothing mocked.

A tiny timm model (``test_resnet.r160_in1k``, whose pretrained config names the hub repository
``timm/test_resnet.r160_in1k``) gets seeded random weights written as ``model.safetensors`` in
a Hugging Face hub cache under ``tmp_path``, in the hub's own layout (``refs/main`` -> a
snapshot whose file links to a content blob); ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` (or
``HF_HOME``) are set for the test only, and the model is loaded by its name through
huggingface_hub and timm. A torchvision model's weights are written under ``TORCH_HOME`` in
torch.hub's ``checkpoints`` folder under torchvision's file name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file
from timm.data import ImageNetInfo
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import make_synthetic_folder
from uqvision.exceptions import CheckpointError, WeightsUnavailableError
from uqvision.models import (
    data_config,
    hub_cache_dir,
    load_model,
    pretrained_weights,
    weights_sha256,
)

NAME = "test_resnet.r160_in1k"
REPO = "timm/test_resnet.r160_in1k"
REVISION = "0123456789abcdef0123456789abcdef01234567"  # a hub commit hash (40 hex digits)
TV_NAME = "shufflenet_v2_x0_5"  # 1.4M parameters, the smallest torchvision model with a Linear head


def _state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = timm.create_model(NAME)
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _write_hub_file(cache: Path, seed: int, revision: str = REVISION) -> tuple[Path, dict]:
    """Seeded weights as ``model.safetensors`` of ``REPO`` at ``revision`` in the hub layout:
    ``blobs/<sha256>``, ``snapshots/<revision>/model.safetensors`` linking to it, and
    ``refs/main`` naming the revision. Returns (the snapshot file, the state dict)."""
    repo = cache / ("models--" + REPO.replace("/", "--"))
    state = _state(seed)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    tmp = repo / "blobs" / "incoming"
    save_file(state, str(tmp))
    blob = repo / "blobs" / _sha(tmp)
    os.replace(tmp, blob)
    snap = repo / "snapshots" / revision / "model.safetensors"
    snap.parent.mkdir(parents=True, exist_ok=True)
    if snap.is_symlink() or snap.exists():
        snap.unlink()
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snap, state


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache, offline, given by ``HF_HUB_CACHE`` at call time."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # nothing from the user's caches
    return cache


def _same_weights(model: torch.nn.Module, state: dict) -> bool:
    got = model.state_dict()
    return set(got) == set(state) and all(torch.equal(got[k].cpu(), state[k]) for k in state)


def test_a_timm_name_loads_its_weights_from_the_offline_hub_cache(hub):
    snap, state = _write_hub_file(hub, seed=3)
    loaded = load_model(NAME)
    assert _same_weights(loaded.model, state)
    assert not _same_weights(timm.create_model(NAME), state)  # not what timm builds anyway
    prov = loaded.provenance()
    assert prov["checkpoint_sha256"] == _sha(snap) == loaded.checkpoint_sha256
    assert (prov["weights_source"], prov["weights_location"], prov["weights_revision"]) == (
        "hf-hub", REPO, REVISION)
    assert prov["weights_file"] == str(snap) and prov["checkpoint"] == ""
    assert (loaded.tag, loaded.num_classes, loaded.class_names_source) == (
        "r160_in1k", 1000, "imagenet-1k")
    assert loaded.data_config.input_size == (3, 160, 160)  # the tag's pretrained config
    assert loaded.data_config == data_config(NAME)  # known before the weights were looked up
    # the bare architecture means its default tag: the same file
    bare = load_model("test_resnet")
    assert bare.checkpoint_sha256 == _sha(snap) and bare.tag == "r160_in1k"
    assert weights_sha256("test_resnet") == _sha(snap)


def test_hf_home_gives_the_cache_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == str(tmp_path / "hf" / "hub")
    snap, state = _write_hub_file(tmp_path / "hf" / "hub", seed=4)
    loaded = load_model(NAME)
    assert _same_weights(loaded.model, state) and loaded.checkpoint_sha256 == _sha(snap)


def test_the_newest_revision_refs_main_names_is_loaded(hub):
    _write_hub_file(hub, seed=3)
    snap, state = _write_hub_file(hub, seed=5, revision="f" * 40)  # the hub moved on
    loaded = load_model(NAME)
    assert _same_weights(loaded.model, state)
    assert loaded.provenance()["weights_revision"] == "f" * 40
    assert loaded.checkpoint_sha256 == _sha(snap)


def test_a_local_file_takes_precedence_over_the_hub_cache(hub, tmp_path):
    _write_hub_file(hub, seed=3)
    local = tmp_path / "mine.safetensors"
    state = _state(7)
    save_file(state, str(local))
    loaded = load_model(f"{NAME}={local}")
    assert _same_weights(loaded.model, state)
    prov = loaded.provenance()
    assert prov["checkpoint_sha256"] == _sha(local)
    assert (prov["weights_source"], prov["weights_file"]) == ("file", str(local))


def test_offline_and_not_cached_is_one_line_naming_the_model_and_the_cache(hub):
    with pytest.raises(WeightsUnavailableError) as info:
        load_model(NAME)
    text = str(info.value)
    assert "\n" not in text
    assert f"model {NAME!r}" in text and f"cache directory {str(hub)!r}" in text
    assert "HF_HUB_OFFLINE is set" in text and REPO in text
    # locating only (download=False) while offline: the same error, nothing written
    with pytest.raises(WeightsUnavailableError, match="HF_HUB_OFFLINE"):
        pretrained_weights(NAME, download=False)
    assert not any(hub.iterdir())


def test_a_name_with_no_pretrained_source_is_one_error(hub):
    with pytest.raises(WeightsUnavailableError, match="'uqvision_cnn' has no pretrained weights"):
        load_model("uqvision_cnn")


def test_random_init_looks_nothing_up(hub):
    loaded = load_model(NAME, num_classes=3, allow_random_init=True)
    assert loaded.num_classes == 3 and loaded.checkpoint_sha256 == ""
    assert loaded.provenance()["weights_source"] == "random_init"


def _imagenet_folder(root: Path) -> Path:
    """A tiny image folder whose two classes are ImageNet-1k WordNet ids (the model's classes
    by name)."""
    folder = make_synthetic_folder(root, n_classes=2, n_per_class=2, image_size=32) / "test"
    wnids = ImageNetInfo("imagenet-1k").label_names()[:2]
    for old, new in zip(sorted(p.name for p in folder.iterdir() if p.is_dir()), wnids):
        (folder / old).rename(folder / new)
    return folder


def test_predict_by_name_from_the_hub_cache_and_a_resume_with_other_weights_is_refused(
        hub, tmp_path, capsys):
    from uqvision.cache import read_cache

    data = _imagenet_folder(tmp_path / "syn")
    out = tmp_path / "caches"
    argv = ["predict", "--model", NAME, "--data", str(data), "--out", str(out),
            "--batch-size", "4"]

    # not cached (offline): one line naming the model and the cache, before anything runs
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"model {NAME!r}" in err and str(hub) in err
    assert not out.exists() or not any(out.iterdir())

    snap, _ = _write_hub_file(hub, seed=3)
    first = _sha(snap)
    assert main(argv) == 0
    # stdout: the cache's path, then the results table (uqvision.results)
    path = Path(capsys.readouterr().out.splitlines()[0])
    attrs = read_cache(path).attrs
    assert attrs["checkpoint_sha256"] == first and attrs["weights_revision"] == REVISION
    assert attrs["weights_location"] == REPO and attrs["weights_source"] == "hf-hub"
    stamp = path.stat().st_mtime_ns

    assert main(argv) == 0  # the same weights: the cache is kept as it is
    capsys.readouterr()
    assert path.stat().st_mtime_ns == stamp

    # the cached file rewritten in place with other weights (through the snapshot's link)
    save_file(_state(seed=9), str(snap))
    second = _sha(snap)
    assert second != first
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "computed from other inputs" in err
    assert f"checkpoint_sha256 '{first[:12]}...' vs '{second[:12]}...'" in err
    assert path.stat().st_mtime_ns == stamp  # kept


def _tv_file(torch_home: Path) -> tuple[Path, dict]:
    """A randomly initialised model's state dict saved where torchvision looks for its
    DEFAULT weights (torch.hub's checkpoints folder, the url's file name)."""
    weights = torchvision.models.get_model_weights(TV_NAME).DEFAULT
    path = torch_home / "hub" / "checkpoints" / os.path.basename(weights.url)
    path.parent.mkdir(parents=True)
    torch.manual_seed(11)
    state = torchvision.models.get_model(TV_NAME, weights=None).state_dict()
    torch.save(state, path)
    return path, state


def test_a_torchvision_name_loads_its_weights_from_the_offline_torch_hub_cache(hub, tmp_path):
    path, state = _tv_file(tmp_path / "torch")  # TORCH_HOME (the hub fixture)
    loaded = load_model(f"tv/{TV_NAME}")
    assert _same_weights(loaded.model, state)
    prov = loaded.provenance()
    assert prov["checkpoint_sha256"] == _sha(path)
    assert (prov["weights_source"], prov["weights_file"], prov["tag"]) == (
        "torchvision", str(path), "IMAGENET1K_V1")
    assert prov["weights_location"].endswith(path.name)
    assert (loaded.num_classes, loaded.class_names_source) == (1000, "imagenet-1k")
    assert loaded.data_config == data_config(f"tv/{TV_NAME}")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():  # timm's feature interface on the pretrained network too
        emb = loaded.model.forward_head(loaded.model.forward_features(x), pre_logits=True)
        assert emb.shape == (2, loaded.model.num_features)
        assert torch.equal(loaded.model.get_classifier()(emb), loaded.model(x))


def test_a_torchvision_name_offline_and_not_cached_names_the_expected_file(hub, tmp_path):
    weights = torchvision.models.get_model_weights(TV_NAME).DEFAULT
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    with pytest.raises(WeightsUnavailableError) as info:
        load_model(f"tv/{TV_NAME}")
    text = str(info.value)
    assert "\n" not in text and f"model 'tv/{TV_NAME}'" in text
    assert os.path.basename(weights.url) in text and f"cache directory {str(folder)!r}" in text
    assert not folder.exists() or not any(folder.iterdir())  # nothing downloaded


class _Payload:
    """Pickles as a call that writes ``marker``: a weight file that runs code when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _malicious(path: Path, state: dict, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**state, "payload": _Payload(marker)}, path)
    return path


def test_a_pickled_torchvision_cache_file_never_runs_code(hub, tmp_path):
    """torch.hub loads torchvision's weights with ``weights_only=False``: a cached file (data,
    possibly planted) that is not tensors only is refused in one line, and runs nothing."""
    weights = torchvision.models.get_model_weights(TV_NAME).DEFAULT
    marker = tmp_path / "ran"
    state = torchvision.models.get_model(TV_NAME, weights=None).state_dict()
    path = _malicious(tmp_path / "torch" / "hub" / "checkpoints" / os.path.basename(weights.url),
                      state, marker)
    with pytest.raises(WeightsUnavailableError) as info:
        load_model(f"tv/{TV_NAME}")
    assert not marker.exists() and "\n" not in str(info.value)
    assert path.name in str(info.value) and "Weights only load failed" in str(info.value)
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None  # restored after the load


@pytest.mark.parametrize("where", ["checkpoint", "hub"])
def test_a_pickled_timm_weight_file_never_runs_code(hub, tmp_path, where):
    """A local ``NAME=FILE.pth`` and a hub-cache ``pytorch_model.bin`` are read tensors only,
    whatever timm version's default: the payload never runs, the error names the file."""
    marker = tmp_path / "ran"
    if where == "checkpoint":
        path = _malicious(tmp_path / "theirs.pth", _state(3), marker)
        spec = f"{NAME}={path}"
    else:
        snap, _ = _write_hub_file(hub, seed=3)
        path = _malicious(snap.parent / "pytorch_model.bin", _state(3), marker)
        snap.unlink()  # only the pickled file is cached
        spec = NAME
    with pytest.raises((CheckpointError, WeightsUnavailableError)) as info:
        load_model(spec)
    assert not marker.exists() and "\n" not in str(info.value), info.value
    assert "does not load" in str(info.value) or "could not" in str(info.value)


def test_a_sidecar_never_says_where_the_weights_come_from(hub, tmp_path):
    """A sidecar's ``pretrained_cfg`` is laid over the model's: it may give the preprocessing,
    never a hub repository, URL or file to read the weights from instead of the checkpoint."""
    local = tmp_path / "mine.safetensors"
    save_file(_state(7), str(local))
    _write_hub_file(hub, seed=3)  # what the sidecar would load instead
    (tmp_path / "mine.json").write_text(json.dumps({"pretrained_cfg": {
        "input_size": [3, 32, 32], "source": "hf-hub", "hf_hub_id": REPO}}))
    for call in (lambda: load_model(f"{NAME}={local}"), lambda: data_config(f"{NAME}={local}")):
        with pytest.raises(InputError, match=r"mine\.json'?: pretrained_cfg names \['hf_hub_id', "
                                             r"'source'\], which are not preprocessing fields"):
            call()
    (tmp_path / "mine.json").write_text(json.dumps({"pretrained_cfg": {"input_size": [3, 32, 32]}}))
    assert load_model(f"{NAME}={local}").data_config.input_size == (3, 32, 32)
