"""Shared fixtures: a small digits folder, one trained tiny checkpoint, synthetic caches."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

import torch

# One intra-op thread: the tests are tiny, and on a shared 2-core machine OpenMP threads that
# spin-wait for each other are several times slower than a single thread.
torch.set_num_threads(1)

from uqmetrics import write_dataset

from uqvision.cache import cache_dataset, cache_key
from uqvision.data import make_digits_folder

ARCH = "test_byobnet"  # BatchNorm + an nn.Dropout head, ~0.2M parameters


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """13 images per class: 65 train / 65 test images (an odd count, for uneven shards)."""
    return make_digits_folder(tmp_path_factory.mktemp("data") / "digits", max_per_class=13)


@pytest.fixture(scope="session")
def trained(digits, tmp_path_factory):
    """One test_byobnet trained for 2 epochs at 16 px (with head dropout; AdamW + OneCycle,
    uqvision's former recipe)."""
    from uqvision.train import ADAMW_RECIPE, TrainConfig, train_model

    out = tmp_path_factory.mktemp("models") / "m0.safetensors"
    return train_model(digits / "train", out, TrainConfig(
        arch=ARCH, epochs=2, input_size=16, drop_rate=0.2, batch_size=32, seed=0,
        hparams=ADAMW_RECIPE))


@pytest.fixture(scope="session")
def spec(trained):
    return f"{ARCH}={trained.checkpoint}"


def _write_cache(directory, logits, labels, *, model, mode="plain", pass_index=0, samples=None,
                classes=None, dataset_name="test", method=None, run=None, sample_index=0):
    """Write a synthetic cache (as `uqvision predict` would) and return its path; ``method``
    (with ``run`` and ``sample_index``) as for a run trained by uqvision."""
    logits = np.asarray(logits, dtype=np.float32)
    n, c = logits.shape[-2:]
    samples = [f"{i:05d}.png" for i in range(n)] if samples is None else samples
    classes = [f"c{j}" for j in range(c)] if classes is None else classes
    attrs = {"model": model, "dataset_name": dataset_name, "mode": mode,
             "pass_index": pass_index}
    if method is not None:
        attrs.update(method=method, run=run or model, sample_index=sample_index)
    ds = cache_dataset(logits, labels, samples=samples, classes=classes, attrs=attrs)
    return write_dataset(ds, directory / f"{cache_key(model, dataset_name, mode, pass_index)}.nc")


def _member_logits(rng, n, c, k, *, signal=2.0, noise=1.5):
    """Labels and k members' logits: a shared signal on the true class plus independent noise."""
    y = rng.integers(0, c, n)
    base = rng.normal(size=(n, c))
    base[np.arange(n), y] += signal
    return y, np.stack([base + noise * rng.normal(size=(n, c)) for _ in range(k)])


@pytest.fixture
def write_cache():
    """``write_cache(dir, logits, labels, *, model, mode, pass_index, samples, classes)``."""
    return _write_cache


@pytest.fixture
def member_logits():
    """``member_logits(rng, n, c, k) -> (labels (n,), logits (k, n, c))``."""
    return _member_logits
