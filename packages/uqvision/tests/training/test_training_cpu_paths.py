"""A training run is bit-identical on one machine, not across CPUs: ATen picks its element-wise
and reduction kernels by the CPU's vector extension, and those round differently. A given
checkpoint's logits, by contrast, agree across those code paths to float32 rounding.

Each run below trains in a fresh interpreter under a forced ATen code path
(``ATEN_CPU_CAPABILITY``), which stands in for a CPU of that instruction set. What another
machine's CPU changes beyond ATen (MKL's and oneDNN's own per-CPU kernels) cannot be forced
here, so this checks the mechanism, not a value on another machine; the README's walkthrough
records what it does to a 20-epoch run (packages/uqvision/README.md, "Reproducibility across
machines").
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

SCRIPT = """
import sys
from uqvision.training.loop import ImageTrainConfig, train_model
data, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
train_model(data, out, ImageTrainConfig(arch="test_byobnet", epochs=1, input_size=16,
                                        batch_size=32, seed=seed), progress=False)
"""

PREDICT = """
import sys
import numpy as np
import torch
from uqvision.data import ImageFolderDataset
from uqvision.models import load_model
spec, data, out = sys.argv[1:4]
loaded = load_model(spec, num_classes=10)
ds = ImageFolderDataset(data, loaded.transform)
with torch.no_grad():
    logits = loaded.model.eval()(torch.stack([ds[i][0] for i in range(len(ds))]))
np.save(out, logits.numpy())
"""

# Forced code paths of the CPU libraries a prediction runs through: ATen's kernels, oneDNN's
# convolutions, MKL's products; (path, the CPU flag it needs).
PREDICT_PATHS = {
    "aten-default": ({"ATEN_CPU_CAPABILITY": "default"}, None),
    "aten-avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, "avx2"),
    "aten-avx512": ({"ATEN_CPU_CAPABILITY": "avx512"}, "avx512f"),
    "onednn-sse41": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, None),
    "mkl-avx2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "avx2"),
}


def _cpu_flags() -> set[str]:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo; all assumed elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"avx2"}
    return {f for line in text.splitlines() if line.startswith("flags")
            for f in line.split(":", 1)[1].split()}


def _run(script: str, *args, forced: dict[str, str]) -> None:
    """``script`` in a fresh interpreter with ``args``, under the ``forced`` variables alone of
    those this file forces (the others removed from the environment)."""
    env = {k: v for k, v in os.environ.items()
           if k not in {k2 for e, _ in PREDICT_PATHS.values() for k2 in e}}
    env.update(forced)
    run = subprocess.run([sys.executable, "-c", script, *map(str, args)], check=False, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def _train(digits, tmp_path, name, *, capability, seed=0) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{name}.safetensors"
    _run(SCRIPT, digits / "train", out, seed,
         forced={"ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "1"})
    return load_file(out)


def _relative(a: dict, b: dict) -> float:
    """max over tensors of max |a - b| / max |a| (float tensors only)."""
    return max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max())
               for k in a if a[k].is_floating_point() and a[k].abs().max() > 0)


@pytest.mark.slow
def test_a_training_run_rounds_with_the_cpu_kernels(digits, tmp_path):
    """One epoch (3 SGD steps) under ATen's kernels without vector extension, twice, and under
    its AVX2 kernels:

    - the same code path twice gives the same bits: a run is reproducible on one machine;
    - the two paths give different weights: which kernels the CPU offers changes the rounding
      (measured on the AVX-512 CPU: 81 of its 88 floating-point tensors differ after 1 epoch);
    - and only the rounding: the two paths' weights differ by less than a thousandth of what
      another seed changes. Float32 rounding (relative 6e-8 per operation) amplified over 3
      steps stays orders of magnitude below that; a path that computed something else (another
      initialisation, another batch order, another loss) would differ like another seed.
    """
    if "avx2" not in _cpu_flags():
        pytest.skip("this CPU has no avx2: ATen's AVX2 kernels cannot run here")
    default = _train(digits, tmp_path, "default", capability="default")
    again = _train(digits, tmp_path, "again", capability="default")
    avx2 = _train(digits, tmp_path, "avx2", capability="avx2")
    other_seed = _train(digits, tmp_path, "seed1", capability="default", seed=1)
    assert default.keys() == again.keys() == avx2.keys()
    assert all(torch.equal(default[k], again[k]) for k in default)
    differing = [k for k in default if not torch.equal(default[k], avx2[k])]
    assert differing, "ATen's default and AVX2 kernels trained the same bits"
    by_path, by_seed = _relative(default, avx2), _relative(default, other_seed)
    assert by_path < 1e-3 * by_seed, (by_path, by_seed)


@pytest.mark.slow
def test_a_checkpoints_logits_agree_across_cpu_code_paths_to_rounding(trained, digits, tmp_path,
                                                                      rounding_tol):
    """The trained checkpoint's logits on the 65 test images, each in a fresh interpreter under
    a forced code path this CPU can run, against the unforced ones: within the float32 rounding
    bound of two differently ordered evaluations (``rounding_tol``)."""
    forced = {k: v for k, v in PREDICT_PATHS.items() if v[1] is None or v[1] in _cpu_flags()}
    spec = f"test_byobnet={trained.checkpoint}"

    def predict(name: str, extra: dict) -> np.ndarray:
        out = tmp_path / f"{name}.npy"
        _run(PREDICT, spec, digits / "test", out, forced=extra)
        return np.load(out)

    reference = predict("own", {})
    assert reference.shape == (65, 10)
    for name, (extra, _) in forced.items():
        np.testing.assert_allclose(predict(name, extra), reference,
                                   **rounding_tol(spec, reference), err_msg=name)
