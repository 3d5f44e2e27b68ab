"""``uqvision evaluate``, killed at any point, resumes to the same results.

The stand-in evaluation of test_evaluate.py (``examples/standin.toml`` on the session's digits:
two networks, four sets, the four protocols, an ensemble; no figures) runs once without a
break, as a real ``python -m uqvision evaluate`` process; its output folder is then moved
aside, and the same command into the same folder is cut five times, each run resuming the
last, before a sixth completes it:

1. SIGKILL (the whole process group, the sweep's workers included) once the sweep has
   written 2 of its 8 caches (4 a model: a model is left with some of its caches);
2. SIGKILL the instant the first score file is linked into place (its temporary name, its
   table, its configuration and the evaluation's record of it not yet removed or written);
3. SIGINT, as a terminal sends it (the child's disposition set to default first: CI may start
   the tests with it ignored), once ``score ood:`` is printed: the OOD scores being computed;
4. SIGKILL the instant before the site folder, complete, takes its place;
5. SIGKILL the instant after, before the evaluation records it.

Points 1 and 3 are chosen from the progress the command shows (cache files, printed lines),
points 2, 4 and 5 by a launcher that kills its own process group at the ``os.link`` or
``os.replace`` that puts the named file in place: each is a fixed point of the run, not a
time. Then:

- the two folders hold the same files (no temporary, lock or half-written file is left),
  every netCDF file reads back complete and verified, and a dry run finds everything up to
  date;
- every result file of the resumed folder equals the uninterrupted one's: the netCDF
  variables bit for bit (on one machine a cache's logits are the same bits for one batch
  size and torch thread count, whatever else runs: docs/conventions.md, the sweep's
  "Outputs"; the scores are deterministic functions of the caches), their attrs but when and
  how fast (:func:`uqmetrics.runs.testing.steady_attrs`, :data:`VOLATILE`), the tables, the
  configurations and the site's data; the caches' ``channels_last_source`` included (a
  cache computed after a resume, its memory format pinned to its model's caches already
  there, records how those were chosen: it recorded ``"given"`` where the uninterrupted run
  recorded ``"auto"``).

Cost: 7 processes, each importing torch (about 60 s of CPU; 100-120 s on a loaded 2-core
machine).
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import SCORED, standin  # noqa: F401  (fixture)
from uqmetrics import read_dataset
from uqmetrics.runs.testing import steady_attrs
from uqmetrics.runs.testing.signals import interruptible

from uqvision.cli import main

pytestmark = pytest.mark.slow

#: What legitimately differs between two runs of one evaluation on one machine, at any depth
#: of the attrs, tables and site data: when and how fast (the OOD scores' ``predict_wall_s``
#: variable, its checksum and the site's checksum of the score file that holds it).
VOLATILE = {"created_utc", "hostname", "wall_time_s", "images_per_s", "predict_wall_s",
            "result_checksum"}
#: Names a write in progress or a lock leaves (uqmetrics.runs.io: ``.<name>.<hex>.tmp``, a
#: replaced folder's ``.old``, ``*.lock``; the evaluation's ``caches/.replaced``).
LEFTOVER = re.compile(r"\.tmp$|\.old$|\.lock$|^\.replaced$")
#: Seconds a child may run.
TIMEOUT = 300

#: Runs ``uqvision`` (argv[3:]) and kills its own process group at the ``os.replace`` or
#: ``os.link`` that puts argv[1] in place, just ``before`` or ``after`` it (argv[2]): a fixed
#: point of the run, whatever the machine's speed.
KILL_AT = """
import os, signal, sys
target, when = os.path.abspath(sys.argv[1]), sys.argv[2]
def tripped(put):
    def wrapper(src, dst, *args, **kwargs):
        hit = os.path.abspath(dst) == target
        if hit and when == "before":
            os.killpg(0, signal.SIGKILL)
        done = put(src, dst, *args, **kwargs)
        if hit:
            os.killpg(0, signal.SIGKILL)
        return done
    return wrapper
os.replace, os.link = tripped(os.replace), tripped(os.link)
from uqvision.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _evaluate_argv(toml: Path, out: Path) -> list[str]:
    return ["--threads", "1", "evaluate", str(toml), "--out", str(out), "--no-figures",
            "--n-workers", "1", "--cell-threads", "1"]


def _caches(out: Path) -> int:
    """The cache files in place (each is renamed into place whole)."""
    return len(list((out / "caches").glob("*.nc")))


def _child(cmd: list[str], env: dict[str, str], *, until: Callable[[str], bool] | None = None,
           send: int = signal.SIGKILL) -> tuple[int, str]:
    """Run ``cmd`` in a process group of its own; once ``until(output so far)`` holds (checked
    every 20 ms), send ``send`` to the whole group. Returns the exit status and the output."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines: list[str] = []  # filled as the child prints (list.extend appends one by one)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    try:
        while until is not None and not until("".join(lines)):
            assert proc.poll() is None, (f"exited {proc.returncode} before the point it was to "
                                         f"be cut at:\n{''.join(lines)}")
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.02)
        if until is not None:
            os.killpg(proc.pid, send)
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=30)
    return code, "".join(lines)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if k not in VOLATILE} for row in csv.DictReader(f)]


def _attrs_apart(name: str, got: dict, want: dict) -> list[str]:
    return [f"{name}: {key} = {got.get(key)!r}, uninterrupted {want.get(key)!r}"
            for key in sorted(set(got) | set(want)) if got.get(key) != want.get(key)]


def _differences(got: Path, want: Path) -> list[str]:
    """Where the result files of ``got`` differ from ``want``'s (the module docstring): the
    netCDF files' variables (bit for bit) and attrs, the tables, the JSON and TOML files but
    the state (it records the files' times); the site's pages, made from its data, are not
    compared. Every netCDF file is read complete and verified (or this raises)."""
    apart, compared = [], 0
    for name in sorted(_files(want)):
        a, b = got / name, want / name
        if b.suffix == ".nc":
            x, y = read_dataset(a), read_dataset(b)
            if sorted(x.variables) != sorted(y.variables):
                apart.append(f"{name}: variables {sorted(x.variables)}, uninterrupted "
                             f"{sorted(y.variables)}")
                continue
            for var in y.variables:
                if var not in VOLATILE and not np.array_equal(
                        x[var].values, y[var].values, equal_nan=x[var].dtype.kind in "fc"):
                    apart.append(f"{name}: variable {var}")
                apart += _attrs_apart(f"{name}: {var}", steady_attrs(dict(x[var].attrs), ()),
                                      steady_attrs(dict(y[var].attrs), ()))
            apart += _attrs_apart(name, steady_attrs(dict(x.attrs), VOLATILE),
                                  steady_attrs(dict(y.attrs), VOLATILE))
        elif b.suffix == ".csv":
            apart += [] if _table(a) == _table(b) else [f"{name}: table"]
        elif b.suffix == ".toml" or (b.suffix == ".json" and b.name != "evaluate.state.json"):
            steady = [steady_attrs(p.read_text(), VOLATILE) for p in (a, b)]
            apart += [] if steady[0] == steady[1] else [f"{name}: content"]
        else:
            continue
        compared += 1
    # 8 caches; 4 score files, tables and configurations; the site's data ...
    assert compared >= 8 + 4 * 3 + 4, compared
    return apart


@pytest.fixture(scope="module")
def interrupted(standin, tmp_path_factory):  # noqa: F811
    """``(out, reference, toml)``: the evaluation cut five times and resumed, and the same
    evaluation uninterrupted (the module docstring), in the same folder one after the other."""
    toml = standin / "examples" / "standin.toml"
    root = tmp_path_factory.mktemp("interrupted")
    out, reference = root / "out", root / "reference"
    (root / "tmp").mkdir()  # the Dask workers' scratch space
    env = {**os.environ, "TMPDIR": str(root / "tmp"), "PYTHONUNBUFFERED": "1"}
    uqvision = [sys.executable, "-m", "uqvision", *_evaluate_argv(toml, out)]

    def kill_at(path: Path, when: str) -> list[str]:
        return [sys.executable, "-c", KILL_AT, str(path), when, *_evaluate_argv(toml, out)]

    code, printed = _child(uqvision, env)
    assert code == 0, printed
    assert "sweep: computed 8, skipped 0" in printed
    assert all(f"score {name}: no score file" in printed for name in SCORED), printed
    out.rename(reference)  # the same folder for the interrupted runs: the same paths in attrs

    # 1. SIGKILL in the sweep, once its second cache is in place
    code, printed = _child(uqvision, env, until=lambda _: _caches(out) >= 2)
    assert code == -signal.SIGKILL and "score " not in printed, printed
    # 2. SIGKILL the instant the first score file is in place
    scores = out / "scores"
    code, printed = _child(kill_at(scores / "selective.nc", "after"), env)
    assert code == -signal.SIGKILL and "sweep: computed" in printed, printed
    assert sorted(p.suffix for p in scores.iterdir()) == [".nc", ".tmp"], printed
    # 3. SIGINT, as from a terminal, while the OOD scores are computed
    code, printed = _child(interruptible(uqvision), env, send=signal.SIGINT,
                           until=lambda text: "score ood:" in text)
    assert code == 130 and "interrupted" in printed, printed
    # 4. SIGKILL the instant before the site, complete, takes its place; 5. the instant after
    code, printed = _child(kill_at(out / "site", "before"), env)
    assert code == -signal.SIGKILL and "score conformal:" in printed, printed
    assert not (out / "site").exists() and list(out.glob(".site.*.tmp/index.html")), printed
    code, printed = _child(kill_at(out / "site", "after"), env)
    assert code == -signal.SIGKILL and (out / "site" / "index.html").is_file(), printed

    code, printed = _child(uqvision, env)  # resumed to the end
    assert code == 0, printed
    assert "sweep: computed 0, skipped 8" in printed, printed
    return out, reference, toml


def test_the_resumed_run_leaves_no_temporary_partial_or_incomplete_file(interrupted, capsys):
    out, reference, toml = interrupted
    assert not [n for n in _files(out) if LEFTOVER.search(Path(n).name)], sorted(_files(out))
    assert _files(out) == _files(reference)
    for path in out.rglob("*.nc"):
        read_dataset(path)  # complete (attr complete = 1) and every variable verified
    assert main(["evaluate", str(toml), "--out", str(out), "--no-figures", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "cells: 0 to compute, 8 complete" in dry and "figures and site: up to date" in dry
    assert all(f"score {name}: up to date" in dry for name in SCORED), dry


def test_the_resumed_results_equal_the_uninterrupted_ones(interrupted):
    out, reference, _ = interrupted
    apart = _differences(out, reference)
    assert apart == []


def test_a_second_evaluation_into_the_folder_is_refused_while_one_runs(
        standin, tmp_path, capsys):  # noqa: F811
    """What the resumed run removes (the temporaries of writes cut short) is removed under the
    output folder's lock: a run that finds it held is refused before any work, naming it."""
    from uqmetrics.runs.io import exclusive_lock

    out = tmp_path / "out"
    with exclusive_lock(out / ".evaluate.lock"):  # as a running evaluation holds it
        assert main(["evaluate", str(standin / "examples" / "standin.toml"), "--out", str(out),
                     "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"uqvision evaluate: error: {out / '.evaluate.lock'}: is held by "
                          "another process (pid ") and err.count("\n") == 1, err
    assert list(out.iterdir()) == []
