import pytest
import torch
from torch import nn

from uqvision.exceptions import WeightsUnavailableError
from uqvision.models import ModelSpec, check_model_name, has_dropout, load_model
from uqvision.training.dropout import PerSampleDropout


@pytest.mark.parametrize("name, close", [
    ("resnet10", "resnet10t"),
    ("test_byobnt", "test_byobnet"),
    ("test_vit.r160_in1kk", "test_vit.r160_in1k"),
    ("tv/mobilenet_v3_smal", "mobilenet_v3_small"),
])
def test_unknown_model_names_suggest_close_names(name, close):
    with pytest.raises(ValueError, match="did you mean") as info:
        check_model_name(name)
    assert close in str(info.value)


def test_known_names_pass():
    for name in ("resnet10t", "resnet10t.c3_in1k", "test_vit", "tv/resnet18"):
        check_model_name(name)


def test_spec_parsing_and_row_names():
    s = ModelSpec.parse("resnet10t=/w/rn.safetensors")
    assert (s.name, s.checkpoint, s.row, s.source) == ("resnet10t", "/w/rn.safetensors",
                                                        "resnet10t@rn", "timm")
    assert ModelSpec("tv/resnet18").source == "tv" and ModelSpec("tv/resnet18").model_name == \
        "resnet18"


def test_no_checkpoint_offline_and_not_cached_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match="1000-class head but the dataset has 10"):
        load_model("resnet10t", num_classes=10)  # the pretrained head, before any look-up
    with pytest.raises(WeightsUnavailableError, match="'resnet10t'.*HF_HUB_OFFLINE is set"):
        load_model("resnet10t")
    with pytest.raises(FileNotFoundError):
        load_model(f"resnet10t={tmp_path / 'absent.pth'}", num_classes=10)


def test_head_mismatch_raises_before_building(tmp_path):
    import timm

    m = timm.create_model("test_resnet", num_classes=7)
    path = tmp_path / "seven.pth"
    torch.save(m.state_dict(), path)
    with pytest.raises(ValueError, match="7-class head .* dataset has 10 classes"):
        load_model(f"test_resnet={path}", num_classes=10)
    loaded = load_model(f"test_resnet={path}", num_classes=7)
    assert loaded.num_classes == 7 and loaded.checkpoint_sha256


def test_torchvision_checkpoint_head_mismatch(tmp_path):
    import torchvision

    path = tmp_path / "mnv3.pth"
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=5).state_dict(), path)
    with pytest.raises(ValueError, match="5-class head"):
        load_model(f"tv/mobilenet_v3_small={path}", num_classes=10)
    loaded = load_model(f"tv/mobilenet_v3_small={path}", num_classes=5)
    assert loaded.data_config.input_size == (3, 224, 224)
    assert loaded.data_config.crop_pct == pytest.approx(224 / 256)


@pytest.mark.parametrize("name", ["test_byobnet", "tv/mobilenet_v3_small"])
def test_mc_dropout_is_live_only_in_dropout_modules(name):
    loaded = load_model(name, num_classes=10, allow_random_init=True)
    model = loaded.model
    if name == "test_byobnet":  # give the head a dropout module with p > 0
        model.head.drop = nn.Dropout(0.5)
    assert has_dropout(model)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    stats = [b.running_mean.clone() for b in bns]
    x = torch.randn(4, 3, 32, 32)
    with PerSampleDropout(model, seed=0) as mc, torch.no_grad():
        assert mc.modules and all(not m.training for m in model.modules())  # all eval
        mc.start_pass(0, range(4))
        a = model(x)
        mc.start_pass(1, range(4))
        b = model(x)
        mc.start_pass(0, range(4))
        again = model(x)
    assert not torch.equal(a, b)  # dropout is live, and differs between passes
    assert torch.equal(a, again)
    assert bns and all(torch.equal(s, b.running_mean) for s, b in zip(stats, bns))  # BN frozen
    with torch.no_grad():
        assert torch.equal(model(x), model(x))  # hooks removed on exit


def test_models_without_dropout_modules():
    loaded = load_model("test_resnet", num_classes=10, allow_random_init=True)
    assert not has_dropout(loaded.model)
    with pytest.raises(ValueError, match="no dropout module with p > 0"):
        PerSampleDropout(loaded.model, seed=0)


def test_unknown_source_lists_the_registered_ones():
    with pytest.raises(ValueError, match="valid model sources: timm, tv"):
        check_model_name("hf/resnet")


def test_the_package_exports_every_module_and_core_keeps_its_names():
    from uqvision import models
    from uqvision.models import checkpoints, core, spec, weights

    assert sorted(models.__all__) == sorted({*spec.__all__, *weights.__all__,
                                             *checkpoints.__all__})
    assert core.__all__ == models.__all__  # the imports of uqvision.models.core keep working
    assert all(getattr(core, n) is getattr(models, n) for n in models.__all__)


def test_a_source_without_pretrained_weights_is_refused_by_name(tmp_path):
    from uqvision.models import check_pretrained, pretrained_weights

    check_pretrained("proto/test_byobnet")  # nothing to check: its loader says what it needs
    with pytest.raises(ValueError, match="model source 'proto' of 'proto/test_byobnet' has no "
                                         "pretrained weights"):
        pretrained_weights("proto/test_byobnet")
    with pytest.raises(ValueError, match="unknown model source 'hf'"):
        load_model("hf/resnet", allow_random_init=True)
