"""Prototype (CLIP-style zero-shot) classifiers as a model source (issue 13 item 4), tested with
a tiny random encoder."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from uqmetrics import fit_temperature_result, nll_loss

from uqvision.data import DataConfig
from uqvision.models import MODEL_SOURCES, data_config, load_model
from uqvision.models.prototype import (
    LOGIT_SCALE_BOUNDS,
    CosineHead,
    PrototypeClassifier,
    class_embeddings,
    fit_logit_scale,
    save_prototype_classifier,
)
from uqvision.predict import PredictConfig, predict

ENCODER = "test_byobnet"


def _encoder(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(ENCODER, num_classes=0).eval()


def _cosine_logits(emb: np.ndarray, classes: np.ndarray, scale: float) -> np.ndarray:
    e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    c = classes / np.linalg.norm(classes, axis=1, keepdims=True)
    return scale * e @ c.T


def test_cosine_head_is_scaled_cosine_similarity():
    rng = np.random.default_rng(0)
    emb, cls = rng.normal(size=(7, 5)), rng.normal(size=(3, 5))
    head = CosineHead(torch.tensor(cls), logit_scale=12.5)
    got = head(torch.tensor(emb, dtype=torch.float32)).detach().numpy()
    np.testing.assert_allclose(got, _cosine_logits(emb, cls, 12.5), rtol=1e-5, atol=1e-5)
    # invariant to the norm of the embeddings and of the class embeddings
    again = CosineHead(torch.tensor(3 * cls), 12.5)(torch.tensor(0.1 * emb, dtype=torch.float32))
    np.testing.assert_allclose(again.detach().numpy(), got, rtol=1e-5, atol=1e-5)
    assert np.abs(got).max() <= 12.5 + 1e-4


@pytest.mark.parametrize("emb, scale, match", [
    (np.ones((1, 4)), 1.0, "n_classes >= 2"), (np.ones(4), 1.0, "n_classes >= 2"),
    (np.ones((3, 4)), 0.0, "logit_scale must be > 0")])
def test_cosine_head_validation(emb, scale, match):
    with pytest.raises(ValueError, match=match):
        CosineHead(torch.tensor(emb), scale)


def test_prototype_classifier_with_random_encoder():
    enc = _encoder()
    x = torch.randn(6, 3, 16, 16)
    cls = torch.randn(4, enc.num_features)
    model = PrototypeClassifier(enc, CosineHead(cls, 30.0)).eval()
    with torch.no_grad():
        logits = model(x).numpy()
        emb = enc(x).numpy()
        feats = model.forward_head(model.forward_features(x), pre_logits=True).numpy()
    np.testing.assert_allclose(logits, _cosine_logits(emb, cls.numpy(), 30.0), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(feats, emb, rtol=1e-6)
    assert model.get_classifier() is model.head


def test_class_embeddings_are_mean_normalised_embeddings(rounding_tol):
    enc = _encoder()
    x = torch.randn(5, 3, 16, 16)
    y = torch.tensor([0, 1, 0, 2, 1])
    got = class_embeddings(enc, x, y, 3, batch_size=2).numpy()
    with torch.no_grad():
        e = enc(x).numpy()
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    expected = np.stack([e[y.numpy() == c].mean(0) for c in range(3)])
    # embedded in batches of 2 against one batch of 5: to float32 rounding
    np.testing.assert_allclose(got, expected, **rounding_tol(enc, expected))
    with pytest.raises(ValueError, match="needs an image"):
        class_embeddings(enc, x, y, 4)


def test_fit_logit_scale_minimises_nll():
    enc = _encoder()
    torch.manual_seed(1)
    x, y = torch.randn(40, 3, 16, 16), torch.arange(40) % 4
    model = PrototypeClassifier(enc, CosineHead(class_embeddings(enc, x, y, 4)))
    with torch.no_grad():
        cos = (model(x) / model.head.logit_scale).double().numpy()
    scale, converged = fit_logit_scale(model, x, y.numpy(), batch_size=16)
    assert converged and LOGIT_SCALE_BOUNDS[0] < scale < LOGIT_SCALE_BOUNDS[1]
    assert float(model.head.logit_scale) == pytest.approx(scale, rel=1e-6)

    def nll(s):
        return nll_loss(y.numpy(), torch.softmax(torch.tensor(cos * s, dtype=torch.float64), 1).numpy())

    # The reference: the same objective minimised on the cosines of ONE batch. The two argmins
    # differ by the optimiser's tolerance (Brent's xatol of 1e-6 in log T, where the NLL is flat)
    # and by the float32 rounding of batched cosines, so they are compared by their objective:
    # at the NLL's minimum a relative change δ of the scale changes it by ~½·s²·NLL''·δ², far
    # below 1e-9 for any δ the optimisers leave (9e-11 for δ = 2e-5 here); 1 % moves it by 2.3e-5.
    fit = fit_temperature_result(cos, y.numpy(), bounds=(1e-4, 10))
    assert nll(scale) == pytest.approx(nll(1 / fit.temperature), rel=1e-9, abs=0)
    for factor in (0.99, 1.01):  # a minimum: 1 % either way costs more than the tolerance above
        assert nll(scale * factor) - nll(scale) > 1e-9 * nll(scale)


def test_save_load_and_predict_through_the_model_source(digits, tmp_path):
    assert "proto" in MODEL_SOURCES.names()
    enc = _encoder(3)
    model = PrototypeClassifier(enc, CosineHead(torch.randn(10, enc.num_features), 25.0))
    dcfg = DataConfig((3, 16, 16), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 1.0)
    ckpt = save_prototype_classifier(model, tmp_path / "proto.safetensors", arch=ENCODER,
                                     pretrained_cfg=dcfg.to_dict(), tag="digits_proto",
                                     classes=[str(i) for i in range(10)])
    loaded = load_model(f"proto/{ENCODER}={ckpt}", num_classes=10)
    assert (loaded.architecture, loaded.tag, loaded.num_classes) == (ENCODER, "digits_proto", 10)
    assert loaded.data_config.input_size == (3, 16, 16)
    assert data_config(f"proto/{ENCODER}={ckpt}") == loaded.data_config == dcfg  # its sidecar's
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        np.testing.assert_allclose(loaded.model(x).numpy(), model.eval()(x).numpy(), rtol=1e-5,
                                   atol=1e-5)
    (cache,) = predict(f"proto/{ENCODER}={ckpt}", digits / "test",
                       PredictConfig(embeddings=True))
    assert cache.attrs["source"] == "proto" and cache["logits"].shape == (65, 10)
    emb = cache["embedding"].values
    np.testing.assert_allclose(cache["logits"].values,
                               _cosine_logits(emb, model.head.class_embeddings.numpy(), 25.0),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="5 classes"):
        load_model(f"proto/{ENCODER}={ckpt}", num_classes=5)


def test_source_refuses_bad_names_and_foreign_checkpoints(trained):
    with pytest.raises(ValueError, match="timm architecture without a tag"):
        load_model("proto/not_a_model", allow_random_init=True)
    for find in (load_model, data_config):
        with pytest.raises(ValueError, match="prototype-classifier sidecar"):
            find(f"proto/{ENCODER}={trained.checkpoint}")
    rnd = load_model(f"proto/{ENCODER}", num_classes=3, allow_random_init=True)
    assert rnd.tag == "random_init" and rnd.num_classes == 3
    assert rnd.data_config == data_config(f"proto/{ENCODER}")  # the encoder's timm default
