"""benchmarks/gpu_check.sh: its default items fit the 8 minutes of a GPU lease, every item named
in docs/gpu.md's table is one the script runs, and without CUDA it says so and exits 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _default_items() -> dict[str, int]:
    match = re.search(r'ITEMS="\$\{ITEMS:-([^}]*)\}"', SCRIPT.read_text())
    assert match, "gpu_check.sh has no default ITEMS"
    return {name: int(budget) for name, budget in
            (item.split(":") for item in match.group(1).split())}


def _script_items() -> set[str]:
    body = SCRIPT.read_text().split("run_item() {", 1)[1]
    return {name for line in re.findall(r"^\s+([a-z0-9_|]+)\)", body, re.MULTILINE)
            for name in line.split("|")}


def test_default_items_fit_eight_minutes():
    items = _default_items()
    assert sum(items.values()) <= 480, items


def test_documented_items_are_the_scripts():
    table = (ROOT / "docs" / "gpu.md").read_text().split("| item |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", table, re.MULTILINE))
    runnable = _script_items()
    assert set(_default_items()) <= documented, set(_default_items()) - documented
    assert documented <= runnable, documented - runnable


def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "WORK": str(tmp_path / "work"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(SCRIPT)], check=False, env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device here" in done.stdout
