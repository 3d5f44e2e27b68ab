"""uqvision installs with pip from a clone into a fresh virtual environment, and runs there.

The README's "Install without tox" installs torch and torchvision, then ``./shared``
(uqmetrics, which is not on PyPI) and ``./packages/uqvision`` with pip into a new environment.
This test runs those ``pip install`` lines of the README, from the clone's root, non-editable,
in a ``python -m venv`` of its own (nothing of the tox environments is used), then runs
``uqvision --help`` and the selective smoke reproduction (about a minute) from that
environment, outside the clone, and reads its result files back.

torch and torchvision are pinned to the pair of tox.ini's uqvision environment (the README's
torch line must name it), so that what is installed is what is tested. The README tells users
to take them from PyTorch's CPU index (``--index-url https://download.pytorch.org/whl/cpu``,
checked here); this machine and CI reach no network beyond the package registries, so the test
runs that line without the option and pip takes the pinned pair from the registry it is
configured with (on this machine, local copies of PyPI's files): PyPI's CUDA build, a 6.3 GB
environment, removed at the end of the test. Measured on the 2-core machine, shared with other work (load
average about 3): 5.3 minutes in all (the install about 2 of them, the reproduction 1 to 2) and
6.1 GB of disk at the most.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import uqmetrics

ROOT = Path(__file__).resolve().parents[1]
#: The index the README gives for CPU-only torch wheels.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _readme_installs() -> dict[str, list[str]]:
    """The ``pip install`` lines of the README's "Install without tox" block: the torch line
    (``"torch"``) and the uqvision line (``"uqvision"``), as argument lists after ``pip``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
              if "pip install ./shared ./packages/uqvision" in b]
    assert len(blocks) == 1, "the README has no (or several) 'Install without tox' blocks"
    lines = [shlex.split(line, comments=True) for line in blocks[0].splitlines()]
    pips = [line[1:] for line in lines if line[:2] == ["pip", "install"]]
    torch = [a for a in pips if any(x.startswith("torch==") for x in a)]
    uqvision = [a for a in pips if "./packages/uqvision" in a]
    assert len(torch) == 1 and len(uqvision) == 1, pips
    return {"torch": torch[0], "uqvision": uqvision[0]}


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
    pins, readme = _tox_pair(), _readme_installs()
    torch_line = readme["torch"]
    assert {f"{k}=={v}" for k, v in pins.items()} <= set(torch_line), torch_line
    at = torch_line.index("--index-url")
    assert torch_line[at + 1] == CPU_INDEX, torch_line
    # no network beyond the registries: the pinned pair from the registry pip is set up with
    del torch_line[at:at + 2]
    try:
        _run([sys.executable, "-m", "venv", venv], env, 300, work)
        # the README's lines, from the clone's root (./shared, ./packages/uqvision), with
        # --no-compile: no .pyc written at install (Python compiles what it imports)
        for line in (torch_line, readme["uqvision"]):
            _run([bin_ / "python", "-m", "pip", "install", "--no-compile", *line[1:]], env,
                 3600, ROOT)

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
