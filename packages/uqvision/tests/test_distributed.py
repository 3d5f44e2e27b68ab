"""Multi-process prediction started the way torchrun starts it (gloo, 2 CPU processes)."""

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
def test_torchrun_two_processes_equal_one_process(spec, digits, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "uqvision", "--threads", "1", "predict", "--model", spec,
           "--data", str(digits / "test"), "--out", str(tmp_path), "--batch-size", "8"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = tmp_path.glob("*.nc")
    assert r.stdout.count(str(path)) == 1  # rank 0 alone reports (and writes) the file
    dist = read_cache(path)
    assert dist.attrs["world_size"] == 2
    folder = ImageFolderDataset(digits / "test")
    assert len(folder) % 2 == 1  # uneven shards: 33 + 32, nothing padded
    ids = list(dist["sample"].values)
    assert ids == folder.sample_ids and len(set(ids)) == len(ids) == 65
    np.testing.assert_array_equal(dist["label"].values, folder.targets)
    (single,) = predict(spec, digits / "test", PredictConfig(batch_size=8))
    np.testing.assert_allclose(dist["logits"].values, single["logits"].values, rtol=1e-5,
                               atol=1e-5)
