"""What would make zoo numbers differ from the Selective paper's (issue 13 item 0):
torchvision preprocessing of the exact weights named, and the MC-dropout pass count."""

from __future__ import annotations

import json

import pytest
import torchvision
import xarray as xr
from safetensors.torch import save_file

from uqvision.cli import main
from uqvision.models import check_model_name, load_model
from uqvision.predict import DEFAULT_PASSES, PredictConfig, predict


@pytest.mark.parametrize("name, tag, resize", [
    ("tv/mobilenet_v3_large.IMAGENET1K_V1", "IMAGENET1K_V1", 256),
    ("tv/mobilenet_v3_large.IMAGENET1K_V2", "IMAGENET1K_V2", 232),
    ("tv/mobilenet_v3_large", "IMAGENET1K_V2", 232),  # no weights named: the DEFAULT member
    ("tv/resnet18", "IMAGENET1K_V1", 256),
])
def test_torchvision_preprocessing_follows_the_weights_named(name, tag, resize, tmp_path):
    model = torchvision.models.get_model(name[3:].split(".")[0], weights=None, num_classes=7)
    ckpt = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    loaded = load_model(f"{name}={ckpt}", num_classes=7)
    assert loaded.tag == tag
    assert loaded.data_config.crop_pct == pytest.approx(224 / resize)
    prov = loaded.provenance()
    assert f"resize_size=[{resize}]" in prov["transform"]  # recorded in every cache
    assert json.loads(prov["data_config"])["crop_pct"] == pytest.approx(224 / resize)
    assert prov["num_params"] == sum(p.numel() for p in model.parameters())


def test_unknown_torchvision_weights_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid: IMAGENET1K_V1, IMAGENET1K_V2"):
        check_model_name("tv/mobilenet_v3_large.IMAGENET1K_V3")
    with pytest.raises(ValueError, match="did you mean"):
        check_model_name("tv/mobilenet_v3_larg.IMAGENET1K_V1")


def test_mc_dropout_defaults_to_thirty_passes_recorded_in_the_cache(trained, digits, tmp_path):
    assert PredictConfig(mode="mc_dropout").passes == DEFAULT_PASSES["mc_dropout"] == 30
    assert PredictConfig(mode="tta").passes == PredictConfig().passes == 1
    spec = f"test_byobnet={trained.checkpoint}"
    (ds,) = predict(spec, digits / "test", PredictConfig(mode="mc_dropout", passes=3))
    assert ds.attrs["n_passes"] == 3 and json.loads(ds.attrs["config"])["passes"] == 3
    # the CLI without --passes: 30 passes for mc_dropout
    assert main(["predict", "--model", spec, "--data", str(digits / "test"), "--out",
                 str(tmp_path), "--mode", "mc_dropout"]) == 0
    (path,) = tmp_path.glob("*mc_dropout-000.nc")
    with xr.open_dataset(path) as c:
        assert c.sizes["pass"] == 30 and c.attrs["n_passes"] == 30
