"""Multi-process prediction and training started the way torchrun starts them (gloo, 2 CPU
processes)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from uqvision.cache import read_cache
from uqvision.data import ImageFolderDataset
from uqvision.predict import PredictConfig, predict


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "tta", "mc_dropout"])
def test_torchrun_two_processes_equal_one_process(spec, digits, tmp_path, mode, rounding_tol):
    """The same caches from 2 gloo processes (uneven shards) as from one: plain, and the
    stochastic passes, whose augmentations and dropout masks depend on (seed, pass, sample)
    only."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the options each mode uses (one it does not use is refused: predict.options.MODE_OPTIONS)
    used = {"plain": {}, "tta": {"passes": 2, "tta_policy": "crop"},
            "mc_dropout": {"passes": 2}}[mode]
    options = ["--mode", mode, "--seed", "3",
               *(x for k, v in used.items() for x in (f"--{k.replace('_', '-')}", str(v)))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "uqvision", "--threads", "1", "predict", "--model", spec,
           "--data", str(digits / "test"), "--out", str(tmp_path), "--batch-size", "8",
           *options]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    paths = sorted(tmp_path.glob("*.nc"))
    assert len(paths) == (2 if mode == "tta" else 1)
    for path in paths:
        assert r.stdout.count(str(path)) == 1  # rank 0 alone reports (and writes) the file
    single = predict(spec, digits / "test", PredictConfig(
        mode=mode, seed=3, batch_size=8, **used))
    folder = ImageFolderDataset(digits / "test")
    assert len(folder) % 2 == 1  # uneven shards: 33 + 32, nothing padded
    for path, one in zip(paths, single, strict=True):
        dist = read_cache(path)
        assert dist.attrs["world_size"] == 2 and dist.attrs["mode"] == mode
        assert dist.attrs["pass_index"] == one.attrs["pass_index"]
        ids = list(dist["sample"].values)
        assert ids == folder.sample_ids and len(set(ids)) == len(ids) == 65
        np.testing.assert_array_equal(dist["label"].values, folder.targets)
        # to float32 rounding (other shards, other batches: conftest._rounding_tol): before
        # masks were drawn per sample, MC-dropout logits moved by 0.08 between 1 and 2 processes
        np.testing.assert_allclose(dist["logits"].values, one["logits"].values,
                                   **rounding_tol(spec, one["logits"].values))


@pytest.mark.slow
def test_torchrun_training_two_processes_reach_the_weights_of_one(digits, tmp_path):
    """The one training loop under torchrun (DistributedDataParallel, gloo): each global batch
    of 16 split 8 + 8, the gradient of the global mean loss, the same augmentations, so the
    weights equal a one-process run's with the same global batch up to float rounding. A
    model without BatchNorm (test_vit): BatchNorm statistics are per rank on CPU."""
    import torch
    from safetensors.torch import load_file

    from uqvision.training.loop import ImageTrainConfig, train_model

    options = ["--arch", "test_vit", "--data", str(digits / "train"), "--input-size", "16",
               "--epochs", "2", "--batch-size", "16", "--seeds", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "uqvision", "--threads", "1", "train", "--out", str(tmp_path / "ddp"),
           *options]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ddp.safetensors") == 1  # rank 0 alone reports (and writes)
    one = train_model(digits / "train", tmp_path / "one", ImageTrainConfig(
        arch="test_vit", input_size=16, epochs=2, batch_size=16, seed=3))
    ddp = load_file(str(tmp_path / "ddp.safetensors"))
    ref = one.model.state_dict()
    assert ddp.keys() == ref.keys()
    for k, v in ddp.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5, msg=k)
    side = json.loads((tmp_path / "ddp.json").read_text())
    assert side["cost"]["world_size"] == 2 and side["cost"]["steps"] == 2 * (65 // 16)
    # the comparison is not vacuous: training moved the weights far beyond the tolerance
    init = train_model(digits / "train", tmp_path / "init", ImageTrainConfig(
        arch="test_vit", input_size=16, epochs=0, batch_size=16, seed=3)).model.state_dict()
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-2
