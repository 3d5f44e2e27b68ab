"""uqvision installs with pip from a clone into a fresh virtual environment, and runs there.

The README's "Install without tox" installs ``./shared`` (uqmetrics, which is not on PyPI) and
``./packages/uqvision`` with pip into a new environment. This test does the same, non-editable,
in a ``python -m venv`` of its own (nothing of the tox environments is used), then runs
``uqvision --help`` and the selective smoke reproduction (about a minute) from that
environment and reads its result files back.

torch and torchvision are pinned to the pair of tox.ini's uqvision environment, the pair the
tests run and the README names, so that what is installed is what is tested. The README tells
users to take them from PyTorch's CPU index (``--index-url
https://download.pytorch.org/whl/cpu``); this machine and CI reach no network beyond the
package registries, so here pip takes the pinned pair from the registry it is configured with
(on this machine, local copies of PyPI's files): PyPI's CUDA build, a 6.3 GB environment,
removed at the end of the test. Measured on the 2-core machine, shared with other work (load
average about 3): 5.3 minutes in all (the install about 2 of them, the reproduction 1 to 2) and
6.1 GB of disk at the most.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import uqmetrics

ROOT = Path(__file__).resolve().parents[1]


def _tox_pair() -> dict[str, str]:
    """torch and torchvision as tox.ini's uqvision environment pins them."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    deps = ini["testenv:uqvision"]["deps"]
    pins = dict(re.findall(r"^\s*(torch|torchvision)==(\S+)\s*$", deps, re.MULTILINE))
    assert set(pins) == {"torch", "torchvision"}, f"tox.ini's uqvision env pins {pins}"
    return pins


def _run(args: list, env: dict, timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (f"{' '.join(map(str, args))} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.mark.slow
def test_uqvision_installs_alone_into_a_fresh_venv_and_reproduces(tmp_path):
    venv = tmp_path / "venv"
    bin_ = venv / "bin"
    # the environment of a user's shell in that venv: none of the tox env's paths
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}",
               MPLBACKEND="Agg", PIP_NO_INPUT="1")
    work = tmp_path / "work"  # not the clone: nothing is imported from its folders
    work.mkdir()
    try:
        _run([sys.executable, "-m", "venv", venv], env, 300, work)
        pins = _tox_pair()
        # --no-compile: no .pyc written at install (Python compiles what it imports); nothing
        # else differs from the README's commands
        _run([bin_ / "python", "-m", "pip", "install", "--no-compile",
              f"torch=={pins['torch']}", f"torchvision=={pins['torchvision']}",
              ROOT / "shared", ROOT / "packages" / "uqvision"], env, 3600, work)

        versions = ("import torch, torchvision, uqmetrics, uqvision; print(torch.__version__, "
                    "torchvision.__version__, uqvision.__file__, uqmetrics.__file__)")
        where = _run([bin_ / "python", "-c", versions], env, 600, work).stdout.split()
        # the pinned releases (a local label, +cu130 here, +cpu from the CPU index, may follow)
        assert [v.split("+")[0] for v in where[:2]] == [pins["torch"], pins["torchvision"]]
        for module in where[2:]:  # installed into the venv, not imported from the clone
            assert Path(module).resolve().is_relative_to(venv.resolve()), module

        assert "reproduce" in _run([bin_ / "uqvision", "--help"], env, 600, work).stdout

        out = tmp_path / "selective-smoke"
        _run([bin_ / "uqvision", "reproduce", "selective", "--scale", "smoke", "--out", out],
             env, 1200, work)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 6.3 GB

    scores = uqmetrics.read_dataset(out / "scores" / "selective.nc")
    assert scores.sizes["model"] >= 2 and int(scores["aurc"].notnull().sum()) > 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis and (out / "summary.md").read_text().strip()
    assert list((out / "caches").glob("*.nc")) and list((out / "models").glob("*.safetensors"))
