"""A tiny study end to end: one netCDF file that re-scores and recomputes its reference alone.

The study (sinusoid, f_main 1 and 2, all methods under two recipes, 3 repetitions × 3 members,
20 epochs, 10 MC passes, float64) is written with ``uqmetrics.write_dataset`` and reopened with
plain ``xr.open_dataset``; coverage is recomputed from the raw variables, the collapse
diagnostics from the file's targets and truth, and the exact reference from
``x_train``/``y_train``/``sigma`` and the registered feature map. A user-registered task runs
through ``run_study`` without edits. A study too large for memory fails before allocating.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import uqmetrics
import xarray as xr

from uqreg import methods as methods_mod
from uqreg.engine import TrainConfig
from uqreg.methods import METHODS
from uqreg.reference import fit_reference
from uqreg.study import StudyConfig, recompute_reference, run_raw, run_study
from uqreg.tasks import TASKS, LinearTask, get_task, register_task, uniform_box

TRAIN = TrainConfig(members=3, epochs=20, mc_samples=10, dtype="float64")
CONFIG = StudyConfig(task="sinusoid", complexities=(1, 2), repetitions=3, seed=4, recipes=("paper", "none"),
                     train=TRAIN)
PER_REP = ("recipe", "method", "complexity", "repetition")


@pytest.fixture(scope="module")
def study_file(tmp_path_factory):
    ds = run_study(CONFIG, progress=False)
    path = uqmetrics.write_dataset(ds, tmp_path_factory.mktemp("study") / "study.nc")
    with xr.open_dataset(path) as f:
        yield f.load()


def test_dims_and_coords(study_file):
    ds = study_file
    for name in ("prediction", "uncertainty"):
        assert ds[name].dims == (*PER_REP, "point")
    for name in ("train_loss", "constant_loss", "collapsed_fraction", "fit_r2"):
        assert ds[name].dims == PER_REP, name
    assert list(ds.recipe.values) == ["paper", "none"]
    assert list(ds.method.values) == list(METHODS)
    assert list(ds.complexity.values) == [1, 2]
    assert list(ds.repetition.values) == [0, 1, 2]
    assert ds.sizes["point"] == 1000
    assert ds["truth"].dims == ("complexity", "point")
    assert ds["x_train"].dims == ("complexity", "train_point", "input_dim")
    assert ds["y_train"].dims == ("complexity", "repetition", "train_point")
    assert ds["x_test"].dims == ("complexity", "point", "input_dim")
    assert ds["coverage"].dims == ("recipe", "method", "complexity", "point")
    np.testing.assert_array_equal(ds["x"].values, np.linspace(-6, 6, 1000))
    assert np.all(np.isfinite(ds["prediction"].values)) and np.all(ds["uncertainty"].values >= 0)


def test_task_data_in_the_file_is_the_task(study_file):
    ds = study_file
    for c in (1, 2):
        inst = get_task("sinusoid").instance(c, 4)
        sub = ds.sel(complexity=c)
        np.testing.assert_array_equal(sub.x_train.values, inst.x_train)
        np.testing.assert_array_equal(sub.y_train.values, inst.targets([0, 1, 2]))
        np.testing.assert_allclose(sub.truth.values, inst.features(sub.x_test.values) @ sub.gamma.values, rtol=1e-12)
        np.testing.assert_array_equal(sub.in_distribution.values.astype(bool), np.abs(inst.x_test[:, 0]) <= 4)
    # repetitions redraw the noise, the inputs stay fixed
    y = ds.y_train.sel(complexity=1).values
    assert not np.allclose(y[0], y[1])


def test_stored_coverage_recomputes_from_raw_variables(study_file):
    ds = study_file
    again = uqmetrics.coverage(ds["prediction"], ds["uncertainty"], ds["truth"], dim="repetition")
    xr.testing.assert_allclose(again.transpose(*ds["coverage"].dims), ds["coverage"].astype(float))
    z = uqmetrics.COVERAGE_Z
    plain = (np.abs(ds.prediction.values - ds.truth.values[None, None, :, None, :]) < z * ds.uncertainty.values).mean(axis=3)
    np.testing.assert_allclose(ds["coverage"].values, plain)
    summary = uqmetrics.coverage_summary(ds[["prediction", "uncertainty", "truth"]])
    xr.testing.assert_allclose(summary["coverage"], ds["coverage"])
    xr.testing.assert_allclose(summary["deviation_mean"], ds["deviation_mean"])
    # region coverage = mean over the region's points of the per-point coverage
    ind = ds.in_distribution.astype(bool)
    np.testing.assert_allclose(ds.region_coverage.sel(region="in").values, ds.coverage.where(ind).mean("point").values)
    np.testing.assert_allclose(ds.region_coverage.sel(region="out").values, ds.coverage.where(~ind).mean("point").values)


def test_reference_recomputes_from_the_file_alone(study_file):
    ds = study_file
    for c in (1, 2):
        mean, std = recompute_reference(ds, c)
        for r in ds.recipe.values:  # the reference has no recipe: the same in every one
            blr = ds.sel({"recipe": r, "method": "blr", "complexity": c})
            np.testing.assert_allclose(blr.prediction.values, mean, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(blr.uncertainty.values, np.broadcast_to(std, mean.shape), rtol=1e-12)
        np.testing.assert_allclose(ds.reference_uncertainty.sel(complexity=c).values, std, rtol=1e-12)
        # independently: OLS on the file's design with the task's feature map
        phi = get_task(ds.attrs["task"]).feature_map(ds.x_train.sel(complexity=c).values, c)
        post = fit_reference(phi, ds.y_train.sel(complexity=c).values, float(ds.attrs["sigma"]))
        np.testing.assert_allclose(post.mean, np.linalg.lstsq(phi, ds.y_train.sel(complexity=c).values.T, rcond=None)[0].T,
                                   rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(ds.uncertainty_ratio.sel({"method": "blr"}).values, 1.0, rtol=1e-12)


def test_provenance_attrs(study_file):
    attrs = study_file.attrs
    for key in ("config", "seed", "device", "wall_time_s", "study_wall_time_s", "conventions", "git_commit",
                "created_utc", "task", "sigma", "numpy_version", "xarray_version", "torch_version",
                "uqreg_version", "uqmetrics_version"):
        assert key in attrs, key
    assert int(attrs["complete"]) == 1
    assert int(attrs["seed"]) == 4 and attrs["device"] == "cpu"
    assert StudyConfig.from_dict(json.loads(attrs["config"])) == CONFIG.resolved()
    recipes = json.loads(attrs["recipes"])  # each recipe's definition
    assert set(recipes) == {"paper", "none"} and recipes["paper"]["l2_mode"] == "coupled"
    assert recipes["none"]["l2_mode"] == "none" and "R.3b" in attrs["collapse_convention"]
    wall = json.loads(attrs["wall_time_s"])
    assert set(wall) == set(METHODS) and all(v >= 0 for v in wall.values())
    assert float(attrs["study_wall_time_s"]) >= sum(wall.values())


def test_single_cell_recomputes_alone(study_file):
    """Repetition 2 of complexity 2, computed alone, equals the same cell of the whole study."""
    cell = StudyConfig(task="sinusoid", complexities=(2,), methods=("cd", "ens_bs"), repetitions=1,
                       first_repetition=2, seed=4, recipes=("none",), train=TRAIN)
    raw = run_raw(cell, progress=False)
    assert list(raw.repetition.values) == [2]
    for var in ("prediction", "uncertainty", "train_loss", "collapsed_fraction"):
        expected = study_file[var].sel({"recipe": ["none"], "method": ["cd", "ens_bs"], "complexity": [2],
                                        "repetition": [2]}).values
        np.testing.assert_array_equal(raw[var].values, expected, err_msg=var)


def test_growing_input_dimension_is_padded():
    """Styblinski–Tang d = 1, 2: x_test/x_train NaN-padded along input_dim; reference still exact."""
    cfg = StudyConfig(task="styblinski_tang", complexities=(1, 2), methods=("blr", "ens"), repetitions=2,
                      n_train=30, train=TrainConfig(members=2, epochs=2))
    ds = run_study(cfg, progress=False)
    assert list(ds.input_size.values) == [1, 2] and list(ds.n_train.values) == [30, 30]
    assert np.all(np.isnan(ds.x_test.sel(complexity=1).values[:, 1]))
    assert np.all(np.isfinite(ds.x_test.sel(complexity=2).values))
    assert "lambda" in ds.coords
    for c in (1, 2):
        mean, std = recompute_reference(ds, c)
        np.testing.assert_allclose(ds.prediction.sel({"method": "blr", "complexity": c})[0].values, mean, rtol=1e-10)
        np.testing.assert_allclose(ds.reference_uncertainty.sel(complexity=c).values, std, rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# a task registered by the user


@pytest.fixture
def cubic_task():
    task = register_task(LinearTask(
        name="cubic_user_test",
        description="user task: cubic polynomial in x",
        input_dim=lambda c: 1,
        feature_map=lambda x, c: x[:, :1] ** np.arange(c + 2),  # (n, 1) -> (n, c + 2)
        gamma=lambda rng, c: rng.uniform(-1, 1, c + 2),
        sigma=0.3,
        n_train=lambda c: 40,
        train_inputs=uniform_box(-2, 2),
        test_inputs=lambda c: np.linspace(-3, 3, 61)[:, None],
        train_box=(-2.0, 2.0),
        complexity_name="degree_minus_1",
    ))
    yield task
    del TASKS[task.name]


def test_user_registered_task_runs_through_the_study(cubic_task, tmp_path):
    cfg = StudyConfig(task=cubic_task.name, complexities=(1, 2), methods=("blr", "ens", "bd"), repetitions=2,
                      train=TrainConfig(members=2, epochs=3, mc_samples=4))
    ds = run_study(cfg, progress=False)
    path = uqmetrics.write_dataset(ds, tmp_path / "cubic.nc")
    back = uqmetrics.read_dataset(path)
    assert back.attrs["task"] == cubic_task.name and back.attrs["complexity_name"] == "degree_minus_1"
    assert back.sizes["param"] == 4  # padded to the largest p = c + 2
    np.testing.assert_array_equal(back.in_distribution.values[0].astype(bool), np.abs(np.linspace(-3, 3, 61)) <= 2)
    for c in (1, 2):
        mean, _std = recompute_reference(back, c)
        np.testing.assert_allclose(back.prediction.sel({"method": "blr", "complexity": c})[0].values, mean,
                                   rtol=1e-10)
        inst = cubic_task.instance(c, 0)
        np.testing.assert_allclose(back.truth.sel(complexity=c).values, inst.f_test, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# configuration validation happens before any training


@pytest.fixture
def no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started before the configuration was validated")

    monkeypatch.setattr(methods_mod.Method, "run", fail)


@pytest.mark.parametrize("kwargs, match", [
    ({"task": "nope"}, "valid tasks: .*sinusoid"),
    ({"methods": ("ens", "nope")}, "valid methods: .*ens_bs"),
    ({"methods": ("ens", "ens")}, "must not repeat"),
    ({"repetitions": 0}, "repetitions"),
    ({"first_repetition": -1}, "first_repetition"),
    ({"complexities": (1, 0)}, "complexit"),
    ({"complexities": ()}, "complexities must be integers >= 1"),  # empty is not "the default"
    ({"methods": ()}, "at least one method"),
    ({"n_train": 3}, "n_train must be at least .* p=4"),
    ({"sigma": -1.0}, "sigma"),
    ({"sigma": 0.0}, "sigma"),
    ({"recipes": ("paper", "nope")}, "valid recipes: paper, sum, decoupled, none"),
    ({"recipes": ("sum", "sum")}, "recipes must not repeat"),
    ({"recipes": ()}, "at least one recipe"),
    ({"train": TrainConfig(max_memory=1e5)}, "max_memory=1e.05 bytes .* of the smallest chunk .2 networks: a chunk of one is computed as two.; raise --max-memory"),
])
def test_invalid_study_config_fails_before_training(no_training, kwargs, match):
    cfg = StudyConfig(**{"task": "sinusoid", "complexities": (1,), "repetitions": 2, **kwargs})
    with pytest.raises(ValueError, match=match):
        run_study(cfg, progress=False)


def test_config_roundtrip():
    cfg = StudyConfig(task="polynomial", complexities=(2,), methods=("blr", "vd"), repetitions=5, seed=9,
                      n_train=100, sigma=0.2, recipes=("sum", "paper"),
                      train=TrainConfig(members=4, hidden=(8, 4), betas=(0.8, 0.99)))
    assert StudyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ---------------------------------------------------------------------------------------------
# the collapse diagnostics in the file


def test_collapse_diagnostics_recompute_from_the_file(study_file):
    """constant_loss = ½·var of each repetition's targets; fit_r2 from prediction and truth over
    the in-distribution points; collapsed_fraction is a fraction of the networks; the reference
    is never collapsed and fits the truth."""
    ds = study_file
    for c in (1, 2):
        sub = ds.sel(complexity=c)
        y = sub.y_train.values[:, :int(sub.n_train)]
        np.testing.assert_allclose(sub.constant_loss.values, np.broadcast_to(0.5 * y.var(axis=1),
                                                                             sub.constant_loss.shape), rtol=1e-12)
        ind = sub.in_distribution.values.astype(bool)
        truth = sub.truth.values[ind]
        resid = ((sub.prediction.values[..., ind] - truth) ** 2).mean(axis=-1)
        np.testing.assert_allclose(sub.fit_r2.values, 1 - resid / truth.var(), rtol=1e-12)
    members = ds.sel({"method": "ens"}).collapsed_fraction.values * 3  # 3 members: multiples of 1/3
    np.testing.assert_allclose(members, np.round(members), atol=1e-12)
    assert set(np.unique(ds.sel({"method": "bd"}).collapsed_fraction.values)) <= {0.0, 1.0}
    blr = ds.sel({"method": "blr"})
    assert np.all(blr.collapsed_fraction.values == 0) and np.all(blr.fit_r2.values > 0.8)
    assert np.all(blr.train_loss.values < 0.95 * blr.constant_loss.values)


# ---------------------------------------------------------------------------------------------
# a study too large for memory fails before allocating


@pytest.fixture
def no_instances(monkeypatch):
    """Drawing a task instance (the first large allocation) fails the test."""
    def fail(*args, **kwargs):
        raise AssertionError("a task instance was drawn before the memory check")

    monkeypatch.setattr(LinearTask, "instance", fail)


def test_too_large_study_fails_before_allocating(no_instances):
    """E.2 at d = 9 (4.3e9 training points) used to die in numpy with a 289 GiB allocation."""
    cfg = StudyConfig(task="styblinski_tang", complexities=(9,), methods=("blr",), repetitions=50)
    est = cfg.memory_estimate(9)
    assert est["n_train"] == 100 * 9**8 and est["input_dim"] == 9
    assert est["data"] > 8 * est["n_train"] * 9  # at least the training inputs (289 GiB)
    with pytest.raises(ValueError, match=r"styblinski_tang at d=9 \(N=4,304,672,100 training points .* needs about "
                                         r"[0-9,.]+ GiB .*--n-train.*--max-memory"):
        run_study(cfg, progress=False)
    # the same check against an explicit limit, for a study that does fit a large machine
    small = StudyConfig(task="styblinski_tang", complexities=(2,), methods=("blr", "ens"), repetitions=4)
    need = small.memory_estimate(2)
    small.check_memory(available=need["data"] + need["training"])
    with pytest.raises(ValueError, match="GiB of memory, more than the"):
        small.check_memory(available=need["data"] + need["training"] - 1)


def test_memory_estimate_bounds_a_real_study():
    """The estimate is an upper bound of what the data of a real (small) study holds."""
    cfg = StudyConfig(task="styblinski_tang", complexities=(2,), methods=("blr",), repetitions=3, n_train=2000)
    inst = cfg.instance(2)
    y = inst.targets(range(3))
    held = inst.x_train.nbytes + y.nbytes + 2 * inst.features(inst.x_train).nbytes
    assert cfg.memory_estimate(2)["data"] >= held


def test_a_diverged_method_is_counted_and_left_out_not_fatal(tmp_path, capsys):
    """Networks trained at a learning rate of 1e6 diverge (non-finite predictions): the study is
    still summarised, plotted and written, ``diverged`` marks exactly the trained method's
    repetitions, the closed-form ``blr`` keeps its coverage, and the printed summary names the
    diverged repetitions (before, the coverage summary raised after all the training:
    "ds['prediction'] contains non-finite values ... pass skipna=True")."""
    from uqreg import cli

    out = tmp_path / "div"
    assert cli.main(["study", "--task", "sinusoid", "--complexities", "1", "--repetitions", "2", "--members", "2",
                     "--epochs", "20", "--lr", "1e6", "--methods", "blr,ens", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DIVERGED under recipe paper: ens (f_main=1: 2 of 2) repetitions" in text
    ds = uqmetrics.read_dataset(out / "study.nc")
    div = ds["diverged"].sel(recipe="paper", complexity=1)
    assert div.sel({"method": "ens"}).values.all() and not div.sel({"method": "blr"}).values.any()
    cov = ds["region_coverage"].sel(recipe="paper", complexity=1)
    assert np.isfinite(cov.sel({"method": "blr"}).values).all() and np.isnan(cov.sel({"method": "ens"}).values).all()
    assert (out / "plots" / "bands_c1.png").stat().st_size > 0
