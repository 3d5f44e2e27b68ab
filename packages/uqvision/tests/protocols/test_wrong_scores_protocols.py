"""Issue 36: scores that were silently wrong, and the messages of the shift, OOD and conformal
scorers, on real cache files (uqvision.predictors.read_cache_groups and the protocols):

- row 9: two caches of one model on one dataset with other logits are refused, naming both
  files (a copy is read once);
- row 18: a temperature fitted on fewer than MIN_TEMPERATURE_SAMPLES images, or on a bound
  of the search, is refused naming the model and the bound;
- row 19: an n_cal too small for a level warns with the smallest n_cal that reaches it, and
  the result records it (Mondrian: classes with too few images);
- NaN logits name the file and count the samples; two class spaces name both files; caches
  of other images under one dataset name (a shifted set's cache given to ``score ood``) are
  refused; ``--trials`` out of range is a range check, on the command line and in a TOML.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xarray as xr
from uqmetrics import InputError, read_dataset, write_dataset
from uqmetrics.metrics.calibration import MIN_TEMPERATURE_SAMPLES

from uqvision.cache import cache_dataset, cache_key
from uqvision.cli import main
from uqvision.protocols.conformal import MAX_TRIALS
from uqvision.protocols.conformal.score import (
    ConformalConfig,
    ShortCalibrationWarning,
    score_conformal,
)
from uqvision.protocols.ood.score import OodConfig, score_ood
from uqvision.protocols.selective.score import SelectiveConfig, score_selective
from uqvision.protocols.shift.score import ShiftConfig, score_shift

C = 4


def _labels(n: int) -> np.ndarray:
    return np.arange(n) % C


def _logits(n: int, seed: int, signal: float = 1.5, c: int = C) -> np.ndarray:
    """Logits of ``n`` images, the label's raised by ``signal``: right and wrong ones mixed."""
    z = np.random.default_rng(seed).normal(size=(n, c))
    z[np.arange(n), np.arange(n) % c] += signal
    return z


def _write(folder, model, dataset, logits, *, role="clean", eval_set="folder", name=None,
           labels=None, classes=None, samples=None, **attrs):
    n, c = logits.shape[-2:]
    attrs = {"model": model, "dataset_name": dataset, "mode": "plain", "pass_index": 0,
             "eval_set": eval_set, "role": role, **attrs}
    if dataset == "val":  # declared the calibration set (test: a clean set's default, test)
        attrs.setdefault("set_role", "calibration")
    ds = cache_dataset(logits, _labels(n) if labels is None else labels,
                       samples=samples or [f"k{i % c}/img{i}.png" for i in range(n)],
                       classes=classes or [f"c{j}" for j in range(c)], attrs=attrs)
    folder.mkdir(parents=True, exist_ok=True)
    return write_dataset(ds, folder / (name or f"{cache_key(model, dataset, 'plain', 0)}.nc"))


def _shift_caches(folder, val=None):
    _write(folder, "m1", "val", _logits(40, 1) if val is None else val)
    _write(folder, "m1", "test", _logits(40, 2))
    _write(folder, "m1", "imagenet-c-fog-1", _logits(40, 3, 0.5), role="shifted",
           eval_set="imagenet-c", eval_member="fog-1", corruption="fog", severity=1)
    return folder


# ---------------------------------------------------------------------- row 9: one name, two


def test_two_caches_of_one_model_and_dataset_with_other_logits_are_refused(tmp_path):
    """Row 9: m1's test cache and another file of the same model, dataset, mode and pass with
    other logits used to be averaged into one softmax without a word (score shift --caches A
    B); now refused, naming both files, for every scorer that groups caches."""
    folder = _shift_caches(tmp_path / "a")
    other = _write(tmp_path / "b", "m1", "test", _logits(40, 99))
    first = folder / f"{cache_key('m1', 'test', 'plain', 0)}.nc"
    for scorer in (score_shift, score_conformal):
        with pytest.raises(InputError) as err:
            scorer([folder, other])
        msg = str(err.value)
        assert str(first) in msg and str(other) in msg, msg
        assert "model 'm1' on dataset 'test'" in msg and "other logits" in msg
    # the selective protocol, which scores one cache per row, used to take the first
    with pytest.raises(InputError, match=rf"^caches '{first}' and '{other}' are both model 'm1' "
                                         r"on dataset 'test' \(mode 'plain'\) with other logits"):
        score_selective([first, other], SelectiveConfig(calibration_size=0.5))
    # the command line: one line, exit 2
    assert main(["score", "shift", "--caches", str(folder), str(other), "--out",
                 str(tmp_path / "s.nc")]) == 2
    assert not (tmp_path / "s.nc").exists()


def test_a_copy_of_a_cache_is_read_once(tmp_path):
    """Row 9: identical content is deduplicated: the scores with a copy of a cache given too
    are those without it, and the copy is not recorded as a second input."""
    folder = _shift_caches(tmp_path / "a")
    copy = tmp_path / "copy.nc"
    shutil.copy(folder / f"{cache_key('m1', 'test', 'plain', 0)}.nc", copy)
    alone = score_shift(folder)
    both = score_shift([folder, copy])
    xr.testing.assert_equal(alone, both)  # values, dims and coords, not attrs
    assert both.attrs["input_checksums"] == alone.attrs["input_checksums"]
    assert json.loads(both.attrs["caches"]) == json.loads(alone.attrs["caches"])


# ----------------------------------------------------------- row 18: the temperature's fit


def test_a_temperature_on_too_few_images_or_at_the_search_bound_is_refused(tmp_path):
    """Row 18: --calibration-size 1e-9 fitted the temperature on 1 image (T = 0.01, the
    search's bound); now below MIN_TEMPERATURE_SAMPLES it is refused, and a fit on the bound
    names the model and the bound."""
    folder = _shift_caches(tmp_path / "c")
    with pytest.raises(InputError, match=(
            rf"^calibration_size 1e-09 \(--calibration-size\): model 'm1' would fit its "
            rf"temperature on 1 of the 40 images of calibration dataset 'val'; the minimum is "
            rf"{MIN_TEMPERATURE_SAMPLES} images")):
        score_shift(folder, ShiftConfig(calibration_size=1e-9))
    assert MIN_TEMPERATURE_SAMPLES == 5
    # 5 images are enough when the fit is inside the search's interval
    assert score_shift(folder, ShiftConfig(calibration_size=5 / 40))["n_calibration"] == 5
    # every calibration image right with a wide margin: the NLL falls all the way to T = 0.01
    sure = _shift_caches(tmp_path / "sure", val=9.0 * np.eye(C)[_labels(40)])
    with pytest.raises(InputError, match=(
            r"^model 'm1', calibration dataset 'val' \(20 images, --calibration-size 0.5\): the "
            r"temperature fitted on 20 samples runs to the search's lower bound T = 0.01 \(bounds "
            r"\(0.01, 100\)\)")):
        score_shift(sure)
    # the conformal protocol's temperature too, naming its own option
    with pytest.raises(InputError, match=r"--temperature-size 0.2\): the temperature fitted on "
                                         r"8 samples runs to the search's lower bound T = 0.01"):
        score_conformal(sure)
    # the command line: one line, exit 2, nothing written
    assert main(["score", "shift", "--caches", str(folder), "--calibration-size", "1e-9",
                 "--out", str(tmp_path / "s.nc")]) == 2
    assert not (tmp_path / "s.nc").exists()


# ---------------------------------------------------------------- row 19: n_cal and alpha


def _conformal_caches(folder, n_test=80):
    _write(folder, "m1", "val", _logits(60, 10))
    _write(folder, "m1", "test", _logits(n_test, 20))
    return folder


def test_an_n_cal_too_small_for_the_level_warns_and_is_recorded(tmp_path, capsys):
    """Row 19: --n-cal 5 at alpha 0.1 gave coverage 1.0 and full sets without a word; now a
    warning names the smallest n_cal that reaches each level (9 at 0.1, 14 for RAPS, which
    holds out its ceil(0.33 n_cal) tuning images), and the result records it."""
    folder = _conformal_caches(tmp_path / "c")
    config = ConformalConfig(n_cal=5, alphas=(0.1,), trials=5, randomized=False)
    with pytest.warns(ShortCalibrationWarning) as caught:
        ds = score_conformal(folder, config)
    (w,) = caught
    msg = str(w.message)
    assert "thr at alpha 0.1 needs n_cal >= 9" in msg and "aps at alpha 0.1 needs n_cal >= 9" \
        in msg and "raps at alpha 0.1 needs n_cal >= 14" in msg and "'m1' (n_cal 5)" in msg
    # what the warning is about: every set full, coverage 1
    full = ds.sel(model="m1", alpha=0.1, calibration="none")
    for method in ("thr", "aps", "raps"):
        assert float(full["coverage"].sel({"method": method})) == 1.0
        assert float(full["mean_set_size"].sel({"method": method})) == C
    # the baselines (topk, naive, naive_deterministic) have no conformal threshold
    assert ds["min_n_cal"].sel(alpha=0.1).values.tolist() == [0, 0, 0, 9, 9, 14, 9]
    assert ds["short_calibration"].sel(model="m1", alpha=0.1).values.tolist() == [
        0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert ds.attrs["notes"] == msg
    # written and read back: the record survives the file
    back = read_dataset(write_dataset(ds, tmp_path / "conformal.nc"))
    assert int(back["min_n_cal"].sel({"method": "raps", "alpha": 0.1})) == 14
    # the command line says it in one line, and writes the result
    assert main(["score", "conformal", "--caches", str(folder), "--n-cal", "5", "--alphas",
                 "0.1", "--trials", "5", "--out", str(tmp_path / "cli.nc")]) == 0
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert line.startswith("uqvision score conformal: note: conformal: too few calibration "
                           "images") and "thr at alpha 0.1 needs n_cal >= 9" in line
    assert read_dataset(tmp_path / "cli.nc").attrs["notes"] == line.split("note: ", 1)[1]
    # n_cal 14 reaches the level for every marginal method: no warning about them
    with pytest.warns(ShortCalibrationWarning) as caught:
        ds = score_conformal(folder, ConformalConfig(n_cal=14, alphas=(0.1,), trials=5))
    (w,) = caught
    assert "needs n_cal" not in str(w.message) and "aps_mondrian at alpha 0.1" in str(w.message)
    assert ds["short_calibration"].sel(model="m1", alpha=0.1).values[:6].tolist() == [0] * 6


def test_mondrian_classes_with_too_few_images_are_counted(tmp_path):
    """Row 19, Mondrian: each class's threshold needs min_n_cal images of the class in a
    trial's draw; the fraction of (trial, class) draws short of it is recorded and warned
    about, by hand for a draw of the whole pool but one image."""
    folder = _conformal_caches(tmp_path / "c", n_test=80)  # 20 images per class
    with pytest.warns(ShortCalibrationWarning, match=(
            r"aps_mondrian at alpha 0.05: up to 100% of the classes' draws hold fewer than 19 "
            r"images of their class")) as caught:
        ds = score_conformal(folder, ConformalConfig(n_cal=40, alphas=(0.05,), trials=4))
    assert len(caught) == 1 and "needs n_cal" not in str(caught[0].message)
    assert float(ds["short_calibration"].sel({"model": "m1", "method": "aps_mondrian",
                                              "alpha": 0.05})) == 1.0
    # 79 of 80 images calibrate: each class has 20 or 19 of its images in the draw, every
    # one enough at 0.05 (19): nothing short, no warning
    ds = score_conformal(folder, ConformalConfig(n_cal=79, alphas=(0.05,), trials=4))
    assert float(ds["short_calibration"].sel({"model": "m1", "method": "aps_mondrian",
                                              "alpha": 0.05})) == 0.0
    assert "notes" not in ds.attrs


# ------------------------------------------------------------------------------- messages


def test_nan_logits_name_the_file_and_count_the_samples(tmp_path):
    """Messages: an OOD cache with two NaN samples of 30: the error names the file and counts
    the samples that hold one (not the whole set)."""
    folder = tmp_path / "c"
    _write(folder, "m1", "test", _logits(40, 1))
    z = _logits(30, 2)
    z[3, 1], z[17] = np.nan, np.inf
    bad = _write(folder, "m1", "far", z, role="ood", eval_set="ood-far",
                 labels=-np.ones(30, np.int64))
    with pytest.raises(InputError, match=(
            rf"^cache '{bad}': the logits of 2 of 30 samples hold NaN or infinity \(the first: "
            r"'k3/img3.png'\)")):
        score_ood(folder, OodConfig(detectors=("msp",)))
    # the selective protocol's too (it said "logits contains non-finite values", no file)
    bad = _write(tmp_path / "selective", "m1", "test", z)
    with pytest.raises(InputError, match=rf"^cache '{bad}': the logits of 2 of 30 samples"):
        score_selective([bad], SelectiveConfig(calibration_size=0.5))


def test_caches_in_two_class_spaces_name_both_files(tmp_path):
    """Messages: one model's caches of 6 and 18 classes (the smoke hierarchy's superclasses
    and classes), and two models of 4 and 6 classes in a conformal result (one class dim)."""
    folder = tmp_path / "c"
    six = _write(folder, "m1", "test", _logits(36, 1, c=6))
    eighteen = _write(folder, "m1", "far", _logits(36, 2, c=18), role="ood", eval_set="ood-far",
                      labels=-np.ones(36, np.int64))
    with pytest.raises(InputError, match=(
            rf"^model 'm1' has caches in two class spaces: '{eighteen}' \('far'\) has 18 "
            rf"classes, '{six}' \('test'\) has 6")):
        score_ood(folder, OodConfig(detectors=("msp",)))
    other = tmp_path / "conformal"
    _write(other, "m1", "val", _logits(60, 3))
    four = _write(other, "m1", "test", _logits(60, 4))
    _write(other, "m2", "val", _logits(60, 5, c=6))
    m2 = _write(other, "m2", "test", _logits(60, 6, c=6))
    with pytest.raises(InputError, match=(
            rf"^the caches are in two class spaces: '{four}' \('test'\) has 4 "
            rf"classes, '{m2}' \('test'\) has 6")):
        score_conformal(other)


def test_a_shifted_sets_cache_given_to_score_ood_is_refused(tmp_path):
    """Messages: a shift cache (another folder's images, here under the ID test set's name for
    the second model) used to end in a numpy broadcast error; now one line naming both
    files."""
    folder = tmp_path / "c"
    first = _write(folder, "m1", "test", _logits(40, 1))
    _write(folder, "m1", "far", _logits(20, 2), role="ood", eval_set="ood-far",
           labels=-np.ones(20, np.int64))
    shifted = _write(folder, "m2", "test", _logits(60, 3))
    _write(folder, "m2", "far", _logits(20, 4), role="ood", eval_set="ood-far",
           labels=-np.ones(20, np.int64))
    with pytest.raises(InputError, match=(
            rf"^caches '{first}' and '{shifted}' of dataset 'test' hold other images \(40 and "
            r"60 samples, or another order\)")):
        score_ood(folder, OodConfig(detectors=("msp",)))
    assert main(["score", "ood", "--caches", str(folder), "--out", str(tmp_path / "o.nc")]) == 2


def test_a_trial_count_out_of_range_is_a_range_check(tmp_path, capsys):
    """Messages: --trials 100000000000 gave a raw MemoryError (or OverflowError); now the
    option's type checks the range, on the command line and in a --config TOML, and so does
    ConformalConfig."""
    folder = _conformal_caches(tmp_path / "c")
    out = tmp_path / "s.nc"
    with pytest.raises(SystemExit) as stop:
        main(["score", "conformal", "--caches", str(folder), "--trials", "100000000000",
              "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert (f"argument --trials: must be <= {MAX_TRIALS} (each trial holds a permutation of "
            "the conformal pool), got 100000000000") in err and err.count("\n") <= 2
    toml = tmp_path / "c.toml"
    toml.write_text("[options]\ntrials = 100000000000\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        main(["score", "conformal", "--config", str(toml), "--caches", str(folder),
              "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"must be <= {MAX_TRIALS}" in err and "Error" not in err.replace("error:", "")
    assert not out.exists()
    with pytest.raises(InputError, match=rf"trials must be a count in \[1, {MAX_TRIALS}\]"):
        ConformalConfig(trials=MAX_TRIALS + 1)


def test_an_overlay_that_is_malformed_or_not_an_overlay_is_refused_naming_it(tmp_path,
                                                                             capsys):
    """Messages: --overlay with JSON nested too deeply (a RecursionError traceback), a list
    that labels none of the images (refused without the file's name), a name that is not a
    string, or a JSON file that is no overlay: one line naming the file, exit 2."""
    folder = _shift_caches(tmp_path / "c")
    _write(folder, "m1", "real", _logits(40, 5), role="relabelled", eval_set="imagenet-real")
    cases = {"deep.json": ("[" * 100_000 + "]" * 100_000, "is not JSON: nested too deeply"),
             # ReaL's list, but the images are not named as ImageNet's validation images
             "other.json": ("[[0], [1]]", "labels none of the 40 samples"),
             "named.json": (json.dumps({"kind": "uqvision.label_overlay", "name": 7,
                                        "labels": {}}), "name must be a non-empty string"),
             "table.json": (json.dumps({"columns": ["model"], "rows": []}),
                            "is not a label overlay")}
    for name, (text, why) in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        assert main(["score", "shift", "--caches", str(folder), "--overlay", str(path),
                     "--out", str(tmp_path / f"{name}.nc")]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and why in err, err
