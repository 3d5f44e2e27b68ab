"""Extra variables of prediction caches: validated, stored, part of what decides reuse."""

import json
import re

import numpy as np
import pytest
from uqmetrics import InputError, read_dataset, write_dataset

from uqvision.cache import (
    EXTRA_ATTR,
    cache_dataset,
    extra_variables,
    missing_variables,
    read_cache,
)
from uqvision.predict import PredictConfig, check_caches, predict, predict_to_files

ATTRS = {"model": "m", "dataset_name": "d", "mode": "plain", "pass_index": 0}


def _arrays(n=4, c=3, passes=None):
    rng = np.random.default_rng(0)
    shape = (n, c) if passes is None else (passes, n, c)
    return {"logits": rng.normal(size=shape), "labels": rng.integers(0, c, n),
            "samples": [f"{i}.png" for i in range(n)], "classes": [f"c{j}" for j in range(c)]}


def test_extra_variables_are_stored_listed_and_checksummed(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    extra = {"head_weight": (("class", "feature"), w), "head_bias": ("class", [0.5, 1.0, 2.0]),
             "seen": ("sample", np.array([True, False, True, True]))}
    ds = cache_dataset(**_arrays(), attrs=ATTRS, extra=extra)
    assert json.loads(ds.attrs[EXTRA_ATTR]) == ["head_bias", "head_weight", "seen"]
    path = write_dataset(ds, tmp_path / "c.nc")
    back = read_cache(path)  # the checksum, extras included, verifies after the round trip
    assert back["head_weight"].dims == ("class", "feature")
    np.testing.assert_array_equal(back["head_weight"].values, w)
    assert back["head_bias"].dtype == np.float64 and back["seen"].values.tolist() == [
        True, False, True, True]
    assert extra_variables(back.attrs) == ("head_bias", "head_weight", "seen")
    assert missing_variables(back, ["seen", "head_norm", "head_bias"]) == ["head_norm"]
    # the checksum covers an extra variable: another value is another checksum
    other = cache_dataset(**_arrays(), attrs=ATTRS, extra={**extra, "head_weight": (
        ("class", "feature"), w + 1)})
    assert other.attrs["checksum"] != ds.attrs["checksum"]
    changed = read_dataset(path)
    changed["head_bias"] = ("class", np.array([0.5, 1.0, 2.5]))
    write_dataset(changed, tmp_path / "changed.nc")
    with pytest.raises(Exception, match="checksum"):
        read_cache(tmp_path / "changed.nc")


def test_a_cache_without_extras_has_no_extra_attr():
    ds = cache_dataset(**_arrays(), attrs=ATTRS)
    assert EXTRA_ATTR not in ds.attrs and extra_variables(ds.attrs) == ()
    assert set(ds.data_vars) == {"logits", "label"}


def test_per_pass_extras_need_a_cache_of_passes():
    ds = cache_dataset(**_arrays(passes=2), attrs=ATTRS, extra={"pass_seed": ("pass", [3, 4])})
    assert ds["pass_seed"].dims == ("pass",) and ds.sizes["pass"] == 2
    with pytest.raises(ValueError, match="extra variable 'pass_seed' has dim 'pass', but the "
                                         "cache has no passes"):
        cache_dataset(**_arrays(), attrs=ATTRS, extra={"pass_seed": ("pass", [3, 4])})


@pytest.mark.parametrize(("extra", "match"), [
    ({"logits": ("sample", np.zeros(4))}, "'logits' clashes with a cache's own variable"),
    ({"feature": ("sample", np.zeros(4))}, "'feature' clashes"),
    ({"w": ("class", np.zeros(4))}, ("extra variable 'w' has 4 along dim 'class', where the "
                                     "cache has 3")),
    ({"w": (("class", "feature"), np.zeros(3))}, r"'w' has 1 axes \(3,\) for dims"),
    ({"w": (("class", "class"), np.zeros((3, 3)))}, "dims must be distinct names"),
    ({"w": ("feature", np.zeros(5)), "v": ("feature", np.zeros(6))},
     "'v' has 6 along dim 'feature', where the cache has 5"),
    ({"w": ("class", np.array(["a", "b", "c"]))}, "must hold numbers or booleans"),
    ({"w": np.zeros(3)}, r"must be a \(dims, array\) pair"),
    ({"": ("class", np.zeros(3))}, "non-empty strings"),
])
def test_bad_extra_variables_are_named(extra, match):
    with pytest.raises(ValueError, match=match):
        cache_dataset(**_arrays(), attrs=ATTRS, extra=extra)


def test_the_embedding_fixes_the_feature_size_of_extras():
    arrays = _arrays()
    cache_dataset(**arrays, embedding=np.zeros((4, 5)), attrs=ATTRS,
                  extra={"w": (("class", "feature"), np.zeros((3, 5)))})
    with pytest.raises(ValueError, match="'w' has 2 along dim 'feature', where the cache has 5"):
        cache_dataset(**arrays, embedding=np.zeros((4, 5)), attrs=ATTRS,
                      extra={"w": (("class", "feature"), np.zeros((3, 2)))})


def test_predict_records_the_classifier_head(spec, digits, tmp_path):
    import torch

    from uqvision.models import load_model

    cfg = PredictConfig(batch_size=32, embeddings=True, extra_variables=["head_weight",
                                                                         "head_bias"])
    assert cfg.extra_variables == ("head_weight", "head_bias")
    (ds,) = predict(spec, digits / "test", cfg)
    (plain,) = predict(spec, digits / "test", PredictConfig(batch_size=32))
    fc = load_model(spec).model.get_classifier()
    assert isinstance(fc, torch.nn.Linear)
    np.testing.assert_array_equal(ds["head_weight"].values, fc.weight.detach().numpy())
    np.testing.assert_array_equal(ds["head_bias"].values, fc.bias.detach().numpy())
    assert ds["head_weight"].dims == ("class", "feature")
    assert ds.sizes["feature"] == ds["embedding"].shape[1]
    # the logits are the head applied to the embedding
    z = ds["embedding"].values @ ds["head_weight"].values.T + ds["head_bias"].values
    np.testing.assert_allclose(z, ds["logits"].values, rtol=1e-4, atol=1e-5)
    assert set(plain.data_vars) == {"logits", "label"} and EXTRA_ATTR not in plain.attrs
    with pytest.raises(ValueError, match="unknown cache variable 'head_norm'"):
        predict(spec, digits / "test", PredictConfig(extra_variables=("head_norm",)))
    with pytest.raises(ValueError, match="need logits"):
        predict(spec, digits / "test", PredictConfig(embeddings=True, logits=False,
                                                     extra_variables=("head_weight",)))


def test_a_cache_written_before_a_needed_variable_is_not_reused(spec, digits, tmp_path):
    (path,) = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(batch_size=32))
    mtime = path.stat().st_mtime_ns
    need = PredictConfig(batch_size=32, extra_variables=("head_weight",))
    with pytest.raises(InputError, match=rf"cache '{re.escape(str(path))}' lacks the variable\(s\) "
                                         r"\['head_weight'\] this run records.*--overwrite"):
        check_caches(spec, digits / "test", tmp_path, need)
    with pytest.raises(InputError, match="lacks the variable"):
        predict_to_files(spec, digits / "test", tmp_path, need)
    assert path.stat().st_mtime_ns == mtime  # kept
    predict_to_files(spec, digits / "test", tmp_path, need, overwrite=True)
    new = read_cache(path)
    assert "head_weight" in new and extra_variables(new.attrs) == ("head_weight",)
    # a cache with more variables than a run needs is reused, by it and by a plain run
    assert check_caches(spec, digits / "test", tmp_path, need)[1] == set()
    assert check_caches(spec, digits / "test", tmp_path, PredictConfig())[1] == set()
