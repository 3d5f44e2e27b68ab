"""Progress of long commands (docs/conventions.md, "Long work shows progress"): ``train``,
``predict``, ``reproduce`` and ``demo`` show it on stderr (a line at the end when stderr is not a
terminal), never on stdout, which holds the results alone; ``uqvision --quiet COMMAND`` shows
none; the process-wide switch (:func:`uqmetrics.runs.sweep.set_progress`) is what a
library caller sets, and ``--quiet`` gives it back once its command is done."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from uqvision.cli import main

ARCH = "test_byobnet"  # conftest's checkpoint


def _train(tmp_path, digits, *quiet: str) -> list[str]:
    return [*quiet, "train", "--arch", ARCH, "--data", str(digits / "train"), "--out",
            str(tmp_path / "m.safetensors"), "--epochs", "1", "--input-size", "16",
            "--batch-size", "32", "--overwrite"]


def test_train_shows_its_progress_on_stderr_and_none_with_quiet(tmp_path, digits, capsys):
    assert main(_train(tmp_path, digits)) == 0
    out, err = capsys.readouterr()
    # the step count and the epoch's loss, on stderr; stdout: the checkpoint line alone
    assert f"train {ARCH} s0: 2/2 steps (100%) epoch 1/1 loss " in err, err
    assert out.count("\n") == 1 and out.startswith(str(tmp_path / "m.safetensors")), out
    assert main(_train(tmp_path, digits, "--quiet")) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_err == "" and quiet_out.startswith(str(tmp_path / "m.safetensors"))
    from uqmetrics.runs.sweep import progress_enabled

    assert progress_enabled()  # --quiet gave the process-wide switch back


def test_the_process_wide_switch_silences_a_library_caller(tmp_path, digits, capsys):
    from uqmetrics.runs.sweep import set_progress

    from uqvision.training.loop import ImageTrainConfig, train_model

    config = ImageTrainConfig(arch=ARCH, epochs=1, input_size=16, batch_size=32)
    shown = train_model(digits / "train", tmp_path / "a.safetensors", config)
    assert "steps (100%)" in capsys.readouterr().err
    before = set_progress(False)
    try:
        quiet = train_model(digits / "train", tmp_path / "b.safetensors", config)
    finally:
        set_progress(before)
    assert capsys.readouterr().err == ""
    assert quiet.losses == shown.losses  # progress changes nothing computed


def _predict(tmp_path, digits, spec, *quiet: str) -> list[str]:
    return [*quiet, "predict", "--model", spec, "--data", str(digits / "test"), "--out",
            str(tmp_path / ("q" if quiet else "c")), "--mode", "tta", "--passes", "2",
            "--batch-size", "16"]


def test_predict_shows_batches_times_passes_on_stderr_and_none_with_quiet(tmp_path, digits,
                                                                           spec, capsys):
    assert main(_predict(tmp_path, digits, spec)) == 0
    out, err = capsys.readouterr()
    # 65 test images in batches of 16: 5 batches, 2 TTA passes
    assert " test: 10/10 forwards (100%)" in err, err
    assert "forwards (" not in out and out.count(".nc\n/") == 1, out  # the two caches
    assert main(_predict(tmp_path, digits, spec, "--quiet")) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_err == "" and quiet_out.count(".nc\n/") == 1
    for name in ("tta-000", "tta-001"):  # the same logits with and without progress
        (shown,) = (tmp_path / "c").glob(f"*{name}.nc")
        (quiet,) = (tmp_path / "q").glob(f"*{name}.nc")
        with xr.open_dataset(shown) as a, xr.open_dataset(quiet) as b:
            np.testing.assert_array_equal(a["logits"].values, b["logits"].values)


def test_demo_says_its_steps_on_stderr_and_its_results_on_stdout(tmp_path, monkeypatch,
                                                                  capsys):
    from uqvision import demo

    def fake_run_demo(out, config, *, log, overwrite):
        log("data: a progress line")
        return demo.DemoResult(Path(out), selective=Path(out, "s.nc"), ensembles=Path(out, "e.nc"))

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.setattr(demo, "summary", lambda r: "a table")
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    out, err = capsys.readouterr()
    assert "progress line" not in out and "a table" in out, out
    assert err == "data: a progress line\n", err
    assert main(["--quiet", "demo", "--out", str(tmp_path / "d")]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "a table" in out


def test_reproduce_trains_with_its_progress_on_stderr_and_none_with_quiet(tmp_path, capsys):
    assert main(["reproduce", "toy", "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "steps (100%)" in err and "steps" not in out, (out, err)
    assert main(["--quiet", "reproduce", "toy", "--out", str(tmp_path / "r"),
                 "--overwrite"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.rstrip().endswith("toy.nc"), (out, err)
