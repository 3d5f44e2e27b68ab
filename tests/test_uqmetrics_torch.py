"""uqmetrics on torch tensors (the ``integration`` env has torch; the ``uqmetrics`` env must not).

uqmetrics accepts tensors without depending on torch (``_validation.as_numpy`` detaches them and
moves them to the CPU). These tests run where torch is installed, so they never skip: every
registered metric, the scoring path, temperature fitting, confidence functions and ensembles
give on tensors what they give on the same numpy arrays.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import uqmetrics
from uqmetrics import (
    UndefinedMetricWarning,
    auroc_score,
    ensemble_log_probs,
    entropy,
    expected_calibration_error,
    fit_temperature,
    nll_loss,
    score_metrics,
    softmax_response,
)
from uqmetrics.metrics.registry import KINDS, get_metric, list_metrics
from uqmetrics.runs.testing import examples


def _inputs(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Numpy inputs of a metric kind (``uqmetrics.metrics.registry.METRIC_KINDS``), n = 40."""
    n = 40
    if kind == "classification":
        z = rng.normal(size=(n, 6)) * 2
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        return rng.integers(0, 6, n), p
    if kind == "selective":
        return rng.random(n) < 0.6, rng.random(n)
    if kind == "regression":
        return rng.normal(size=n), rng.normal(size=n), rng.uniform(0.2, 2.0, n)
    if kind == "ood":
        return rng.random(n), rng.random(n // 2) + 0.3
    if kind == "retrieval":
        return rng.normal(size=(n, 4)), rng.integers(0, 3, n), rng.random(n)
    raise AssertionError(f"no inputs for kind {kind!r}")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_torch_inputs(kind):
    assert _inputs(kind, np.random.default_rng(0))


@pytest.mark.parametrize("name", list_metrics())
def test_every_registered_metric_agrees_on_tensors(name):
    spec = get_metric(name)
    args = _inputs(spec.kind, np.random.default_rng(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        ref = spec.func(*args)
        got = spec.func(*(torch.from_numpy(np.asarray(a)) for a in args))
    assert got == pytest.approx(ref, rel=1e-12, nan_ok=True), name


def test_score_metrics_on_tensors():
    labels, probs = _inputs("classification", np.random.default_rng(2))
    metrics = list_metrics(kind="classification") + list_metrics(kind="selective")
    ref = score_metrics(labels, probs, metrics=metrics)
    got = score_metrics(torch.from_numpy(labels), torch.from_numpy(probs), metrics=metrics)
    assert got == pytest.approx(ref, rel=1e-12)


# The five tensor tests that used to skip in the uqmetrics env:


def test_fit_temperature_accepts_torch():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 200)
    z = rng.normal(size=(200, 3)) + 1.5 * np.eye(3)[y]
    ref = fit_temperature(z, y)
    assert fit_temperature(torch.tensor(z), torch.tensor(y)) == pytest.approx(ref, rel=1e-12)


def test_classification_metrics_accept_torch():
    labels, probs, _, _ = examples.model_b()
    ref = nll_loss(labels, probs)
    assert nll_loss(torch.tensor(labels), torch.tensor(probs)) == pytest.approx(ref, rel=1e-15)
    assert expected_calibration_error(torch.tensor(labels), torch.tensor(probs)) == \
        pytest.approx(0.4)


def test_confidence_functions_accept_torch():
    z = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.1, 0.0]], dtype=torch.float32)
    np.testing.assert_allclose(softmax_response(z, from_logits=True),
                               softmax_response(z.double().numpy(), from_logits=True))
    p = torch.softmax(z.double(), dim=1)
    np.testing.assert_allclose(entropy(p), entropy(p.numpy()))


def test_ensembles_accept_torch():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 10, 4))
    lp = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
    np.testing.assert_allclose(ensemble_log_probs(torch.tensor(lp)), ensemble_log_probs(lp))


def test_selective_metrics_accept_torch():
    c = torch.tensor([True, False, True, True])
    k = torch.tensor([0.9, 0.4, 0.6, 0.1], dtype=torch.float32)
    assert auroc_score(c, k) == auroc_score(c.numpy(), k.numpy()) == 2 / 3


def test_tensors_that_require_grad_are_detached():
    p = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
    assert uqmetrics.brier_loss(torch.tensor([0, 1]), p) == pytest.approx(0.13)


def test_bfloat16_and_float8_tensors_are_widened_exactly():
    """What bf16 autocast hands back: numpy has no bfloat16 (``.numpy()`` raises), so the
    metrics widen a floating dtype numpy lacks to float32, which holds its values exactly; a
    non-floating one is a clear error naming the argument and the dtype."""
    c = torch.tensor([True, False, True, True, False, True])
    k = torch.tensor([0.9, 0.4, 0.6, 0.1, 0.3, 0.75], dtype=torch.bfloat16)
    assert auroc_score(c, k) == auroc_score(c.numpy(), k.float().numpy())
    z = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.5, 0.0]], dtype=torch.bfloat16)
    np.testing.assert_array_equal(softmax_response(z, from_logits=True),
                                  softmax_response(z.float().numpy(), from_logits=True))
    f8 = k.to(torch.float8_e4m3fn)
    assert auroc_score(c, f8) == auroc_score(c.numpy(), f8.float().numpy())
    with warnings.catch_warnings():  # torch: "ComplexHalf support is experimental"
        warnings.simplefilter("ignore", UserWarning)
        half_complex = torch.zeros(6, dtype=torch.complex32)
    with pytest.raises(ValueError, match="confidence has torch dtype torch.complex32"):
        auroc_score(c, half_complex)
