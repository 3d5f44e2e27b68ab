"""The model sources (issue 26): typed registry entries, each model's preprocessing known at plan
time (``data_config(spec)`` equal to what the built model gives), and timm's feature interface on
torchvision models (embeddings through the same path as timm's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.torch
import timm
import torch
import torchvision

from uqvision.data import DataConfig, ImageFolderDataset
from uqvision.models import (
    MODEL_SOURCES,
    ModelSource,
    ModelSpec,
    PretrainedSource,
    data_config,
    load_model,
)
from uqvision.models.sources import (
    TimmSource,
    TorchvisionFeatures,
    TorchvisionSource,
    timm_data_config,
    with_feature_interface,
)
from uqvision.predict import PredictConfig, head_only_dropout, predict
from uqvision.training.dropout import PerSampleDropout

SMALL = DataConfig((3, 32, 32), (0.4, 0.5, 0.6), (0.2, 0.25, 0.3), 1.0, "bilinear")


def test_every_registered_source_is_a_typed_model_source():
    """The built-in sources, then the plugins' (the test session installs the toy plugin's
    ``toy`` source, conftest.py): every one is a :class:`ModelSource`."""
    built_in = [n for n in MODEL_SOURCES.names() if n not in MODEL_SOURCES.plugins]
    assert built_in == ["timm", "tv", "proto"] and "toy" in MODEL_SOURCES.plugins
    assert all(isinstance(s, ModelSource) for s in MODEL_SOURCES.values())
    assert MODEL_SOURCES["timm"] is TimmSource and MODEL_SOURCES["tv"] is TorchvisionSource
    # pretrained weights: timm and tv only (a sweep asks ``hasattr(source, "pretrained")``)
    assert [isinstance(MODEL_SOURCES[n], PretrainedSource) for n in built_in] == [True, True,
                                                                                   False]


# --------------------------------------------------------------------------------------------
# data_config at plan time


@pytest.mark.parametrize("name", [
    "test_resnet",                                 # an architecture without a tag: its default
    "test_vit.r160_in1k",
    "resnet18",                                    # default tag a1_in1k: crop 0.95, bicubic
    "resnet18.a1_in1k",
    "resnet18.tv_in1k",                            # crop 0.875, bilinear
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k",   # crop 0.9, mean/std 0.5
    "convnextv2_nano.fcmae_ft_in22k_in1k_384",     # 384 px, crop_mode squash, crop 1.0
    "uqvision_cnn",                                # uqvision's own architecture
    "tv/resnet18",                                 # DEFAULT = IMAGENET1K_V1: 256 -> 224
    "tv/resnet50.IMAGENET1K_V2",                   # 232 -> 224
    "tv/squeezenet1_0",
    "proto/test_byobnet",
])
def test_data_config_at_plan_time_is_the_built_models(name):
    planned = data_config(name)
    hash(planned)  # a sweep groups its models by it
    built = load_model(name, num_classes=3, allow_random_init=True)
    assert planned == built.data_config
    assert planned == data_config(ModelSpec(name))
    if ModelSpec(name).source == "timm":  # and timm's own resolution of the built model
        model = timm.create_model(name, pretrained=False, num_classes=3)
        assert planned == DataConfig.from_dict(timm.data.resolve_model_data_config(model))


def test_data_config_of_crop_pct_and_crop_mode_beyond_the_default():
    assert data_config("resnet18.a1_in1k").crop_pct == 0.95
    assert data_config("resnet18.tv_in1k").crop_pct == 0.875
    assert data_config("vit_tiny_patch16_224.augreg_in21k_ft_in1k").crop_pct == 0.9
    squash = data_config("convnextv2_nano.fcmae_ft_in22k_in1k_384")
    assert (squash.input_size, squash.crop_mode) == ((3, 384, 384), "squash")
    assert data_config("tv/resnet50.IMAGENET1K_V2").crop_pct == pytest.approx(224 / 232)
    assert len({data_config(n) for n in ("resnet18", "resnet18.a1_in1k", "resnet18.tv_in1k",
                                          "tv/resnet18")}) == 2  # grouped by preprocessing


@pytest.mark.parametrize("arch", timm.list_models("test_*"))
def test_data_config_of_every_tiny_timm_architecture_and_tag(arch):
    names = [arch, *timm.list_pretrained(f"{arch}.*")]
    for name in names:  # on the CPU (tiny): before timm 1.0.21 most fail on the meta device
        model = timm.create_model(name, pretrained=False)
        assert data_config(name) == DataConfig.from_dict(
            timm.data.resolve_model_data_config(model)), name


def _timm_checkpoint(tmp_path, sidecar: dict | None, name: str = "test_resnet") -> str:
    torch.manual_seed(0)
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(timm.create_model(name, num_classes=3).state_dict(), str(path))
    if sidecar is not None:
        (tmp_path / "w.json").write_text(json.dumps(sidecar))
    return f"{name}={path}"


@pytest.mark.parametrize("sidecar", [
    None,                                                # no sidecar: the tag's
    {"classes": ["a", "b", "c"]},                        # a sidecar without pretrained_cfg
    {"pretrained_cfg": SMALL.to_dict()},                 # what uqvision train writes
    {"pretrained_cfg": {"crop_pct": 0.8, "input_size": [3, 48, 48]}},  # over the tag's
])
def test_data_config_of_a_timm_checkpoint_follows_its_sidecar(tmp_path, sidecar):
    spec = _timm_checkpoint(tmp_path, sidecar)
    assert data_config(spec) == load_model(spec, num_classes=3).data_config
    if sidecar and "pretrained_cfg" in sidecar:
        assert data_config(spec).input_size == tuple(sidecar["pretrained_cfg"]["input_size"])
        assert data_config(spec) != data_config("test_resnet")


def test_data_config_of_a_trained_run_is_its_sidecars(spec):
    from uqvision.training.runs import load_run

    assert data_config(spec) == load_run(spec).loaded.data_config
    assert data_config(spec).input_size == (3, 16, 16)


@pytest.mark.parametrize("with_sidecar", [False, True])
def test_data_config_of_a_torchvision_checkpoint(tmp_path, with_sidecar):
    path = tmp_path / "mnv3.pth"
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=3).state_dict(), path)
    if with_sidecar:
        (tmp_path / "mnv3.json").write_text(json.dumps({"pretrained_cfg": SMALL.to_dict()}))
    spec = f"tv/mobilenet_v3_small={path}"
    assert data_config(spec) == load_model(spec, num_classes=3).data_config
    assert data_config(spec) == (SMALL if with_sidecar else data_config("tv/mobilenet_v3_small"))


def test_timm_data_config_lays_the_overlay_over_the_tags():
    base = timm_data_config("test_resnet.r160_in1k")
    assert timm_data_config("test_resnet.r160_in1k", {}) == base
    over = timm_data_config("test_resnet.r160_in1k", {"crop_pct": 0.5})
    assert over.crop_pct == 0.5 and over.input_size == base.input_size


@pytest.mark.parametrize("name, match", [
    ("resnet18.no_such_tag", "unknown pretrained tag 'no_such_tag'"),
    ("tv/resnet18.NOPE", "unknown weights 'NOPE'"),
    ("hf/resnet", "unknown model source 'hf'"),
    ("proto/resnet18.a1_in1k", "timm architecture without a tag"),
])
def test_data_config_refuses_unknown_names(name, match):
    with pytest.raises(ValueError, match=match):
        data_config(name)


# --------------------------------------------------------------------------------------------
# torchvision models speak timm's feature interface


@pytest.mark.parametrize("name, width", [
    ("resnet18", 512),               # head: fc
    ("mobilenet_v3_small", 1024),    # head: classifier (Linear, Hardswish, Dropout, Linear)
    ("shufflenet_v2_x0_5", 1024),
    ("efficientnet_b0", 1280),       # classifier (Dropout, Linear)
    ("regnet_y_400mf", 440),
])
def test_torchvision_models_have_timms_feature_interface(name, width):
    loaded = load_model(f"tv/{name}", num_classes=5, allow_random_init=True, seed=3)
    model = loaded.model
    with torch.random.fork_rng(devices=[]):  # the plain torchvision model, same weights
        torch.manual_seed(3)
        plain = torchvision.models.get_model(name, weights=None, num_classes=5).eval()
    assert isinstance(model, TorchvisionFeatures) and isinstance(model, type(plain))
    assert type(model).__name__ == type(plain).__name__
    assert list(model.state_dict()) == list(plain.state_dict())  # checkpoints unchanged
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        logits = model(x)
        assert torch.equal(logits, plain(x))
        feats = model.forward_features(x)
        assert torch.equal(model.forward_head(feats), logits)
        emb = model.forward_head(feats, pre_logits=True)
        assert model.num_features == width and emb.shape == (3, width)
        assert model.get_classifier() is [m for m in model.modules()
                                          if isinstance(m, torch.nn.Linear)][-1]
        torch.testing.assert_close(model.get_classifier()(emb), logits, rtol=0, atol=1e-6)
    assert with_feature_interface(model) is model  # once only


def test_the_feature_split_keeps_dropout_in_the_head():
    """Under MC dropout the head's dropout runs in forward_head, before the pre-logit embedding:
    the classifier of the embedding is the logits of the same masks (predict's embedding
    path)."""
    loaded = load_model("tv/mobilenet_v3_small", num_classes=5, allow_random_init=True)
    model = loaded.model
    x = torch.randn(2, 3, 32, 32)
    with PerSampleDropout(model, seed=0) as mc, torch.no_grad():
        mc.start_pass(1, [0, 1])
        feats = model.forward_features(x)
        split = model.forward_head(feats)
        mc.start_pass(1, [0, 1])
        emb = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(model.get_classifier()(emb), split, rtol=0, atol=1e-6)
        mc.start_pass(1, [0, 1])
        assert torch.equal(split, model(x))
        mc.start_pass(2, [0, 1])
        assert not torch.equal(model.forward_head(feats), split)
        assert not torch.equal(model.forward_head(feats, pre_logits=True), emb)


def test_a_network_without_a_linear_head_keeps_its_own_interface(digits):
    loaded = load_model("tv/squeezenet1_0", num_classes=10, allow_random_init=True)
    assert not hasattr(loaded.model, "forward_head")
    assert type(loaded.model) is torchvision.models.SqueezeNet
    with pytest.raises(ValueError, match="embeddings need a timm model"):
        predict("tv/squeezenet1_0", digits / "test",
                PredictConfig(embeddings=True, allow_random_init=True))


def test_embeddings_of_a_torchvision_model_through_predict(digits, tmp_path):
    """A tv/ checkpoint at 32 px (its sidecar's preprocessing): embeddings (n, num_features)
    cached through forward_features -> forward_head(pre_logits) -> get_classifier, with the
    logits of the plain prediction; MC dropout computes the backbone once per batch."""
    classes = sorted(p.name for p in (digits / "test").iterdir() if p.is_dir())
    torch.manual_seed(0)
    path = tmp_path / "mnv3.pth"
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=len(classes)).state_dict(),
               path)
    (tmp_path / "mnv3.json").write_text(json.dumps({"pretrained_cfg": SMALL.to_dict(),
                                                    "classes": classes}))
    spec = f"tv/mobilenet_v3_small={path}"
    (emb,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=32))
    (plain,) = predict(spec, digits / "test", PredictConfig(batch_size=32))
    assert emb["embedding"].dims == ("sample", "feature")
    assert emb["embedding"].shape == (65, load_model(spec).model.num_features) == (65, 1024)
    np.testing.assert_allclose(emb["logits"].values, plain["logits"].values, rtol=0, atol=1e-5)
    loaded = load_model(spec)
    ds = ImageFolderDataset(digits / "test").with_transform(loaded.transform)
    with PerSampleDropout(loaded.model, seed=0) as mc:
        assert head_only_dropout(loaded, ds, 0, PredictConfig(mode="mc_dropout"), "cpu", mc)
    mc_runs = [predict(spec, digits / "test", PredictConfig(mode="mc_dropout", passes=2,
                                                            embeddings=e, batch_size=32))[0]
               for e in (False, True)]
    assert mc_runs[0].attrs["mc_dropout_path"] == "features_once"
    np.testing.assert_allclose(mc_runs[1]["logits"].values, mc_runs[0]["logits"].values,
                               rtol=0, atol=1e-5)  # the first pass's masks in its embeddings
