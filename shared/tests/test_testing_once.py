"""``uqmetrics.runs.testing.once``: work made once per test run, shared by processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from uqmetrics.runs.testing.once import once_per_run, shared_root

#: A process that asks for the work "w": its make records the call, sleeps, writes a file.
_ASK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from uqmetrics.runs.testing.once import once_per_run

    root = Path(sys.argv[1])
    def make(folder):
        with open(root / "calls", "a") as f:
            f.write("x")
        time.sleep(0.5)  # the other process asks meanwhile
        (folder / "out.txt").write_text("made")
        return str(folder / "out.txt")
    print(once_per_run(root, "w", make))
""")


def test_two_processes_asking_at_once_make_it_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _ASK, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(tmp_path / "w" / "out.txt")] * 2
    assert (tmp_path / "calls").read_text() == "x"  # made by one of them, read by the other
    assert once_per_run(tmp_path, "w", lambda folder: pytest.fail("made again")) == outs[0]


def test_a_make_that_raises_is_made_again_from_an_empty_folder(tmp_path):
    def broken(folder):
        (folder / "half").write_text("")
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        once_per_run(tmp_path, "w", broken)
    assert not (tmp_path / "w.done").exists()
    assert once_per_run(tmp_path, "w", lambda folder: sorted(p.name for p in folder.iterdir())) == []


def test_the_shared_root_is_the_workers_common_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert shared_root(tmp_path / "pytest-3") == tmp_path / "pytest-3"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert shared_root(tmp_path / "pytest-3" / "popen-gw1") == tmp_path / "pytest-3"
