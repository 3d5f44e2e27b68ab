"""The disentanglement study (docs/conventions.md#r-7-study, :mod:`uqreg.disentangle`).

- Every score against an independent computation (scipy's ``spearmanr``, numpy means, the
  normal quantile written out) on small arrays, ties and a region without points included.
- The two parts: a cell stores the method's epistemic variance as ``epistemic_variance`` and
  its aleatoric one as ``aleatoric_variance`` (checked against the method's own
  :meth:`~uqreg.methods.MethodResult.decompose` and against the exact oracle's formulas), and
  the scores tell them apart: the exact parts swapped do not score as the exact parts.
- ``uqreg reproduce disentangle --scale smoke`` end to end: files, figures, findings (written
  atomically), resume; files of another scale or configuration (or a cell of an earlier
  revision of its method) refused without ``--overwrite``, replaced with it.
- The CLI: ``uqreg methods`` lists the ``+mv`` versions, ``--nll-beta`` reaches the training
  configuration.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import uqmetrics
from scipy.stats import spearmanr

from uqreg import cli
from uqreg.disentangle import (
    ORACLE,
    POINT_SCORES,
    REGION_SCORES,
    SCALES,
    run_cell,
    run_task,
    score_arrays,
    scores,
    spearman,
    task_data,
)
from uqreg.engine import TrainConfig
from uqreg.methods import get_method, mean_variance_method_names
from uqreg.reference import reference_decomposition
from uqreg.tasks import get_task

Z95 = 1.959963984540054  # the normal quantile at 0.975, written out


def _expected(mean, epi, ale, truth, t_epi, t_ale, y_new, inside):
    """The scores, one repetition and one region at a time, with scipy's spearmanr."""
    exp = {"aleatoric_ratio": np.mean(ale / t_ale, axis=0), "epistemic_ratio": np.mean(epi / t_epi, axis=0),
           "truth_coverage": np.mean(np.abs(mean - truth) < Z95 * np.sqrt(epi), axis=0),
           "new_coverage": np.mean(np.abs(y_new - mean) < Z95 * np.sqrt(epi + ale), axis=0)}
    rows = {n: np.full((mean.shape[0], 2), np.nan) for n in REGION_SCORES}
    for j, mask in enumerate((inside, ~inside)):
        if not mask.any():
            continue
        for r in range(mean.shape[0]):
            e, a = epi[r, mask], ale[r, mask]
            rows["log10_aleatoric_ratio"][r, j] = np.mean(np.log10(a / t_ale[mask]))
            rows["log10_epistemic_ratio"][r, j] = np.mean(np.log10(e / t_epi[mask]))
            rows["aleatoric_spearman"][r, j] = spearmanr(a, t_ale[mask])[0]
            rows["epistemic_spearman"][r, j] = spearmanr(e, t_epi[mask])[0]
            rows["epistemic_leakage"][r, j] = spearmanr(e, t_ale[mask])[0]
            rows["aleatoric_leakage"][r, j] = spearmanr(a, t_epi[mask])[0]
            rows["estimates_spearman"][r, j] = spearmanr(e, a)[0]
            rows["region_truth_coverage"][r, j] = np.mean(np.abs(mean[r, mask] - truth[mask])
                                                          < Z95 * np.sqrt(e))
            rows["region_new_coverage"][r, j] = np.mean(np.abs(y_new[r, mask] - mean[r, mask])
                                                        < Z95 * np.sqrt(e + a))
    return {**exp, **rows}


@pytest.mark.parametrize("inside", [np.array([1, 1, 0, 1, 0, 1, 1, 0, 0, 1], bool), np.ones(10, bool)],
                         ids=["in-and-out", "no-point-out"])
def test_scores_equal_an_independent_computation(inside):
    rng = np.random.default_rng(7)
    r, t = 4, 10
    mean, y_new = rng.normal(size=(r, t)), rng.normal(size=(r, t))
    epi, ale = rng.uniform(0.05, 2, (r, t)), rng.uniform(0.05, 2, (r, t))
    ale[1, :5] = ale[1, 0]  # ties: average ranks
    truth = rng.normal(size=t)
    t_epi, t_ale = rng.uniform(0.05, 2, t), rng.uniform(0.05, 2, t)
    got = score_arrays(mean, epi, ale, truth, t_epi, t_ale, y_new, inside)
    want = _expected(mean, epi, ale, truth, t_epi, t_ale, y_new, inside)
    assert set(got) == set(POINT_SCORES) | set(REGION_SCORES)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)
    if not (~inside).any():
        assert np.isnan(got["epistemic_leakage"][:, 1]).all()


def test_spearman_of_a_constant_is_nan_and_is_rank_based():
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))
    assert spearman(np.arange(5.0), np.exp(np.arange(5.0))) == pytest.approx(1.0)  # monotone, not linear


@pytest.fixture(scope="module")
def het():
    """sinusoid_het at f_main = 1, two repetitions, and a tiny float64 training configuration."""
    cfg = TrainConfig(dtype="float64", hidden=(8, 6), members=3, mc_samples=4, epochs=3, recipe="sum", nll_beta=0.5)
    return "sinusoid_het", 1, 2, cfg


def test_a_cell_stores_each_part_under_its_own_name(het):
    """The cell's ``epistemic_variance`` is the method's epistemic part (variance over members of
    μₘ) and ``aleatoric_variance`` its aleatoric part: swapping them in :func:`run_cell` fails."""
    task, c, reps, cfg = het
    cell = run_cell(task, c, "ens+mv", reps, train=cfg).isel(method=0, complexity=0)
    inst = get_task(task).instance(c, 0)
    dec = get_method("ens+mv").train_predict(inst, inst.targets(np.arange(reps)), np.arange(reps), cfg).decompose()
    np.testing.assert_array_equal(cell.epistemic_variance.values, dec.epistemic_variance)
    np.testing.assert_array_equal(cell.aleatoric_variance.values, dec.aleatoric_variance)
    assert not np.allclose(dec.epistemic_variance, dec.aleatoric_variance)  # a swap would be seen

    oracle = run_cell(task, c, ORACLE, reps).isel(method=0, complexity=0)
    exact = reference_decomposition(inst, inst.targets(np.arange(reps)))
    np.testing.assert_array_equal(oracle.aleatoric_variance.values[0], inst.noise_std(inst.x_test) ** 2)
    np.testing.assert_array_equal(oracle.epistemic_variance.values[1], exact.epistemic_variance)


def test_the_scores_tell_the_parts_apart(het):
    """The exact parts score as exact (ratios 1, Spearman 1 with their truths, the oracle's
    leakage = Spearman of the two truths); swapped, they do not."""
    task, c, reps, _ = het
    data = task_data(task, (c,), reps).isel(complexity=0)
    t_epi, t_ale = data.exact_epistemic_variance.values, data.exact_aleatoric_variance.values
    mean = reference_decomposition(get_task(task).instance(c, 0),
                                   get_task(task).instance(c, 0).targets(np.arange(reps))).mean
    args = (data.truth.values, t_epi, t_ale, data.new_targets.values, data.in_distribution.values)
    right = score_arrays(mean, np.tile(t_epi, (reps, 1)), np.tile(t_ale, (reps, 1)), *args)
    swapped = score_arrays(mean, np.tile(t_ale, (reps, 1)), np.tile(t_epi, (reps, 1)), *args)
    np.testing.assert_allclose(right["aleatoric_ratio"], 1.0)
    np.testing.assert_allclose(right["epistemic_spearman"], 1.0)
    truths = spearman(t_epi[data.in_distribution.values], t_ale[data.in_distribution.values])
    np.testing.assert_allclose(right["epistemic_leakage"][:, 0], truths)
    assert abs(truths) < 0.9  # the two truths are not the same ranking, so a swap shows
    assert not np.allclose(swapped["aleatoric_ratio"], 1.0, rtol=0.1)
    assert np.all(swapped["epistemic_spearman"][:, 0] < 0.9)


def test_reproduce_disentangle_smoke_end_to_end_and_resumes(tmp_path, monkeypatch):
    from uqreg import disentangle
    from uqreg.disentangle import reproduce_disentangle

    scale = SCALES.lookup("smoke")
    paths = reproduce_disentangle(tmp_path, scale="smoke", progress=False)
    names = {p.name for p in paths}
    assert "findings.md" in names
    for task in scale.tasks:
        assert f"disentangle_{task}_variances.png" in names and f"disentangle_{task}_leakage.png" in names
        ds = uqmetrics.read_dataset(tmp_path / task / "study.nc")
        assert list(ds.method.values) == [ORACLE, *scale.methods]
        assert list(ds.complexity.values) == list(scale.tasks[task])
        for name in (*POINT_SCORES, *REGION_SCORES):
            assert name in ds
        # the stored scores are those of the stored raw variables
        again = scores(ds[["prediction", "epistemic_variance", "aleatoric_variance", "truth",
                           "exact_epistemic_variance", "exact_aleatoric_variance", "new_targets",
                           "in_distribution"]].assign_attrs(ds.attrs))
        for name in REGION_SCORES:
            np.testing.assert_array_equal(again[name].values, ds[name].values)
        oracle = ds.sel({"method": ORACLE})
        np.testing.assert_allclose(oracle.aleatoric_ratio.values, 1.0)
        np.testing.assert_allclose(oracle.epistemic_ratio.values, 1.0)
    text = (tmp_path / "findings.md").read_text()
    assert "sign test p =" in text and "leakage" in text and "ens+mv" in text
    cells = sorted((tmp_path / next(iter(scale.tasks)) / "cells").glob("*.nc"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    task = next(iter(scale.tasks))
    again = run_task(scale, task, tmp_path / task, progress=False)  # resumes: no cell is trained again
    assert [p.stat().st_mtime_ns for p in cells] == stamps
    np.testing.assert_array_equal(again.epistemic_variance.values,
                                  uqmetrics.read_dataset(tmp_path / task / "study.nc").epistemic_variance.values)
    # findings.md is written atomically: a write that fails midway (a character UTF-8 cannot
    # encode) leaves the previous one intact and no temporary file (Path.write_text truncated it)
    monkeypatch.setattr(disentangle, "summary_table", lambda studies: "\udcff")
    with pytest.raises(UnicodeEncodeError):
        reproduce_disentangle(tmp_path, scale="smoke", progress=False)  # resumes: nothing trained
    assert (tmp_path / "findings.md").read_text() == text
    assert not list(tmp_path.glob(".findings.md.*"))


def _tiny(name="smoke", **kw):
    """A smoke-sized scale of one task, one complexity and ``ens+mv`` (its cells share their file
    names with the smoke scale's)."""
    from dataclasses import replace

    small = replace(SCALES.lookup("smoke"), name=name, tasks={"sinusoid_het": (1,)}, methods=("ens+mv",),
                    repetitions=2)
    return replace(small, **kw)


def _stamps(folder):
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_cell_of_another_configuration_is_refused_unless_overwrite(tmp_path):
    """A rerun into the same folder with another configuration (more epochs and members, more
    repetitions) is refused before any work, naming the cell file and what differs; nothing on
    disk changes (before: the cells were recomputed and replaced with a line on stderr only).
    With ``overwrite`` they are replaced, giving the study a fresh folder gives; a rerun at the
    same configuration then resumes without error and trains nothing."""
    from dataclasses import replace

    small = _tiny()
    other = replace(small, repetitions=3, train=replace(small.train, epochs=7, members=4))
    run_task(small, "sinusoid_het", tmp_path / "a", progress=False)
    before = _stamps(tmp_path / "a")
    with pytest.raises(uqmetrics.InputError, match=r"--scale smoke: .*a/cells/c1_blr\.nc holds a cell computed at "
                       r"scale 'smoke', from another configuration than scale 'smoke' asks for \(repetitions 2 "
                       r"\(asked 3\), train\.epochs 5 \(asked 7\), train\.members 3 \(asked 4\)\); pass "
                       r"--overwrite to replace it, or write to another --out"):
        run_task(other, "sinusoid_het", tmp_path / "a", progress=False)
    assert _stamps(tmp_path / "a") == before
    again = run_task(other, "sinusoid_het", tmp_path / "a", progress=False, overwrite=True)
    fresh = run_task(other, "sinusoid_het", tmp_path / "b", progress=False)
    for v in ("prediction", "epistemic_variance", "aleatoric_variance"):
        assert np.all(np.isfinite(again[v].values)), v
        np.testing.assert_array_equal(again[v].values, fresh[v].values)
    cells = _stamps(tmp_path / "a" / "cells")
    resumed = run_task(other, "sinusoid_het", tmp_path / "a", progress=False)  # same configuration: resumes
    assert _stamps(tmp_path / "a" / "cells") == cells
    np.testing.assert_array_equal(resumed.epistemic_variance.values, fresh.epistemic_variance.values)


def test_a_study_of_another_scale_is_refused_unless_overwrite(tmp_path, monkeypatch, capsys):
    """``uqreg reproduce disentangle`` into an ``--out`` holding another scale's study is refused
    before any work by the check of ``uqreg reproduce`` and ``reproduce real``
    (:func:`uqreg.study.reproduced_study`), naming the file, the scale found, the scale asked and
    ``--overwrite``; nothing on disk changes (before: its cells were replaced and ``study.nc``
    rewritten, with a line on stderr). With ``--overwrite`` the study of the scale asked
    replaces it: the one a fresh ``--out`` gets."""
    from uqreg.disentangle import reproduce_disentangle

    monkeypatch.setitem(SCALES, "tiny", _tiny("tiny", repetitions=3))
    out = tmp_path / "repro"
    assert cli.main(["reproduce", "disentangle", "--scale", "smoke", "--out", str(out), "--quiet"]) == 0
    before = _stamps(out)
    capsys.readouterr()
    assert cli.main(["reproduce", "disentangle", "--scale", "cpu", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert ("--scale cpu: " + str(out / "disentangle" / "sinusoid_het" / "study.nc")
            + " holds a study computed at scale 'smoke'; pass --overwrite to replace it by one at scale 'cpu'") in err
    assert _stamps(out) == before
    disentangle = out / "disentangle"
    with pytest.raises(uqmetrics.InputError, match="holds a study computed at scale 'smoke'; pass --overwrite"):
        reproduce_disentangle(disentangle, scale="tiny", progress=False)
    assert _stamps(out) == before
    reproduce_disentangle(disentangle, scale="tiny", progress=False, overwrite=True)
    reproduce_disentangle(tmp_path / "fresh", scale="tiny", progress=False)
    got = uqmetrics.read_dataset(disentangle / "sinusoid_het" / "study.nc")
    want = uqmetrics.read_dataset(tmp_path / "fresh" / "sinusoid_het" / "study.nc")
    assert got.attrs["reproduce_scale"] == "tiny" and got.sizes["repetition"] == 3
    for v in ("prediction", "epistemic_variance", "aleatoric_variance", *REGION_SCORES):
        np.testing.assert_array_equal(got[v].values, want[v].values)
    # the option reaches the study from the command line
    seen = {}
    monkeypatch.setattr("uqreg.disentangle.reproduce_disentangle", lambda out, **kw: seen.update(kw) or [])
    assert cli.main(["reproduce", "disentangle", "--scale", "cpu", "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert seen["overwrite"] is True and seen["scale"] == "cpu"


def test_a_cell_of_an_earlier_revision_is_not_reused(tmp_path):
    """A ``cd+mv`` cell computed before its KL/N lost the σ² factor (revision 0: its recorded
    configuration has no ``revision``) is refused, naming the revision, and never combined;
    an ``ens+mv`` cell (revision 0, unchanged) keeps the configuration it always had."""
    from dataclasses import replace

    from uqreg.disentangle import _cell_config, _scale_of

    scale = _tiny(methods=("cd+mv",), train=replace(SCALES.lookup("smoke").train, epochs=2, mc_samples=3))
    task_dir = tmp_path / "sinusoid_het"
    run_task(scale, "sinusoid_het", task_dir, progress=False)
    path = task_dir / "cells" / "c1_cd+mv.nc"
    cell = uqmetrics.read_dataset(path)
    config = json.loads(cell.attrs["cell_config"])
    assert config["revision"] == 1
    del config["revision"]  # as the code before the fix wrote it
    cell.attrs["cell_config"] = json.dumps(config, sort_keys=True)
    del cell.attrs["reproduce_scale"]
    uqmetrics.write_dataset(cell.load(), path, overwrite=True)
    with pytest.raises(uqmetrics.InputError, match=r"c1_cd\+mv\.nc holds a cell computed by another run, from "
                       r"another configuration .*\(revision absent \(asked 1\)\); pass --overwrite"):
        run_task(scale, "sinusoid_het", task_dir, progress=False)
    train = replace(scale.train, device="cpu")
    assert "revision" not in json.loads(_cell_config(scale, "sinusoid_het", 1, "ens+mv", train))
    assert "revision" not in json.loads(_cell_config(scale, "sinusoid_het", 1, ORACLE, train))
    # a cell written before cells recorded their scale: the scale is found from its configuration
    cpu = SCALES.lookup("cpu")
    old = json.loads(_cell_config(cpu, "styblinski_tang_het", 2, "vd+mv", replace(cpu.train, device="cpu")))
    del old["revision"]
    assert _scale_of(json.dumps(old), "styblinski_tang_het", 2, "vd+mv") == "cpu"
    assert _scale_of(json.dumps(old), "styblinski_tang_het", 2, "ens+mv") is None


def test_uqreg_methods_lists_the_mean_variance_versions(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in mean_variance_method_names():
        assert f"\n{name} " in out


def test_nll_beta_option_reaches_the_training_configuration():
    args = cli.build_parser().parse_args(["study", "--task", "sinusoid_het", "--methods", "ens+mv",
                                          "--nll-beta", "0.5"])
    ((_, study),) = cli._studies_from_args(args)
    assert study.train.nll_beta == 0.5
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["study"].format_help()
    assert "--nll-beta" in help_text and "ens+mv" in help_text
