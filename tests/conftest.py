import os
import shutil
import subprocess
from pathlib import Path

import pytest
from uqmetrics.runs.testing import register_profiles
from uqmetrics.runs.testing.once import once_per_run, shared_root

register_profiles()


@pytest.fixture(scope="session")
def selective_smoke(tmp_path_factory) -> Path:
    """The folder of ``uqvision reproduce selective --scale smoke`` (the installed console
    script), made once per test run and shared by the pytest-xdist workers
    (:func:`uqmetrics.runs.testing.once.once_per_run`). Tests only read it: one that changes a
    file works on its own copy."""

    def make(folder: Path) -> str:
        out = folder / "selective"
        exe = shutil.which("uqvision")
        assert exe, "the uqvision console script must be installed"
        res = subprocess.run([exe, "--threads", "1", "reproduce", "selective", "--scale", "smoke",
                              "--out", str(out)], check=False, capture_output=True, text=True,
                             timeout=900, env={**os.environ, "MPLBACKEND": "Agg"})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return str(out)

    return Path(once_per_run(shared_root(tmp_path_factory.getbasetemp()), "selective-smoke", make))
