"""How a study is executed must not change a bit of its result: the check, as a function that
the tests run in-process and, under forced instruction sets, in fresh interpreters.

``python execution_check.py METHOD,... DIM,...`` prints, as JSON, the number of float32
prediction elements of every method × input dimension × execution variant that differ from the
one-chunk run. The environment of the interpreter chooses the code paths a CPU would take
(``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ``MKL_CBWR``, the caller's threads), which
must be set before torch is imported; hence a script.

The shapes are chosen so that a product the engine sent to BLAS with a dimension of 1 would
show: a first layer of fan-in 1 and width 50 over 20 training rows is a one-row product
``(1, 20)·(20, 50)``, which MKL computes differently for a batch of one network than inside
a batch of 40 (measured on AMD Zen 5 and Intel AVX-512).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np

from uqreg.engine import TrainConfig, make_plan
from uqreg.methods import get_method
from uqreg.tasks import LinearTask, get_task

SEED = 11
EPOCHS = 5  # bit-identity: a changed summation order shows in the first step already
HIDDEN = (50, 20, 8)

# An anisotropic 2-D task (input ranges differ by a factor 8, so the per-dimension FGSM step matters).
ANISO = LinearTask(
    name="aniso_execution_test",
    input_dim=lambda c: 2,
    feature_map=lambda x, c: np.stack([np.ones(len(x)), x[:, 0], x[:, 1], x[:, 0] * x[:, 1]], axis=1),
    gamma=lambda g, c: g.uniform(0, 1, 4),
    sigma=0.5,
    n_train=lambda c: 30,
    train_inputs=lambda g, n, d, c: g.uniform([-1.0, -8.0], [1.0, 8.0], size=(n, 2)),
    test_inputs=lambda c: np.stack([np.linspace(-2, 2, 40), np.linspace(10, -10, 40)], axis=1),
    train_box=(-8.0, 8.0),
)


def instance(dim: int):
    """The task instance with ``dim`` inputs (1: the sinusoid, whose first layer has fan-in 1)."""
    return ANISO.instance(1, SEED) if dim == 2 else get_task("sinusoid").instance(1, SEED, n_train=20)


def mismatches(name: str, dim: int) -> dict[str, int]:
    """Elements of ``prediction``, ``uncertainty``, ``train_loss`` and ``collapsed_fraction`` that
    differ from the one-chunk float32 run, per execution variant: chunks of 2 and of 1 network
    (one after the other) and chunks of 1 on two concurrent threads."""
    inst = instance(dim)
    method = get_method(name)  # a registered method or a version of one (``ens+mv``)
    cfg = TrainConfig(dtype="float32", members=3, mc_samples=6, hidden=HIDDEN, epochs=EPOCHS, parallel_chunks=1)
    # an odd number of networks, so that chunks of 2 end with a lone network (computed padded)
    reps = list(range(9 if method.ensemble else 19))
    y = inst.targets(reps)

    def plan(c):
        return make_plan(method.job(inst, y, reps, c, epochs=EPOCHS))

    per_net = plan(cfg).per_network
    variants = {
        "chunks of 2": replace(cfg, chunk_networks=2),
        "chunks of 1": replace(cfg, chunk_networks=1),
        "concurrent chunks of 1": replace(cfg, chunk_networks=1, parallel_chunks=2, max_memory=4.5 * per_net),
    }
    assert plan(cfg).n_chunks == 1
    assert plan(variants["chunks of 2"]).chunk == 2 and len(method.networks(reps, cfg)) % 2 == 1
    assert plan(variants["concurrent chunks of 1"]).workers == 2
    whole = method.run(inst, y, reps, cfg, epochs=EPOCHS)
    out = {}
    for label, variant in variants.items():
        result = method.run(inst, y, reps, variant, epochs=EPOCHS)
        out[label] = sum(int(np.sum(~((getattr(result, what) == getattr(whole, what))
                                      | (np.isnan(getattr(result, what)) & np.isnan(getattr(whole, what))))))
                         for what in ("prediction", "uncertainty", "train_loss", "collapsed_fraction",
                                      "aleatoric_variance")
                         if getattr(whole, what) is not None)
    return out


if __name__ == "__main__":
    import torch

    names, dims = sys.argv[1].split(","), [int(d) for d in sys.argv[2].split(",")]
    report = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "mismatches": {f"{n}-{d}": mismatches(n, d) for n in names for d in dims}}
    print(json.dumps(report))
