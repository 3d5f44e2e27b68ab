"""``uqvision demo`` rerun into the same ``--out`` with another training option retrains the
members and recomputes their caches; with the same options it keeps them. Before, a member was
kept whenever its checkpoint existed: ``--epochs 2`` after ``--epochs 1`` scored the 1-epoch
networks under the new options."""

from __future__ import annotations

import pytest

from uqvision.cache import read_cache
from uqvision.demo import DemoConfig, run_demo
from uqvision.models import file_sha256, read_sidecar

SMALL = {"members": 1, "max_per_class": 10, "mc_passes": 2, "n_orders": 2,
         "calibration_size": 0.4}


@pytest.mark.slow
def test_a_rerun_with_other_epochs_retrains_and_recomputes_the_caches(tmp_path):
    first = run_demo(tmp_path, DemoConfig(epochs=1, **SMALL))
    ckpt = first.checkpoints[0]
    sha = file_sha256(ckpt)
    again = run_demo(tmp_path, DemoConfig(epochs=1, **SMALL))  # same options: kept
    assert file_sha256(ckpt) == sha
    assert read_sidecar(ckpt)["train_config"]["epochs"] == 1
    second = run_demo(tmp_path, DemoConfig(epochs=2, **SMALL))
    assert read_sidecar(ckpt)["train_config"]["epochs"] == 2
    assert file_sha256(ckpt) != sha
    assert sorted(second.caches) == sorted(again.caches)
    for path in second.caches:  # every cache is of the network trained now
        assert read_cache(path).attrs["checkpoint_sha256"] == file_sha256(ckpt)
