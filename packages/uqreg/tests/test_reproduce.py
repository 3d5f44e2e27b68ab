"""``uqreg reproduce``: the recipe-sensitivity studies end to end at the smoke scale, and the
verdicts of the findings table on constructed inputs (each finding's threshold as stated)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from uqreg.reproduce import (
    EXPERIMENTS,
    NEAR,
    SCALES,
    findings,
    findings_table,
    recipe_table,
    reproduce,
)

METHODS = ["blr", "bd", "cd", "vd", "ens", "ens_adv", "ens_bs"]


def _summary(coverage_in: dict, coverage_out: dict, collapsed: dict, *, se: float = 0.02, levels=(1, 2, 3)):
    """A minimal E.1 summary: region coverage per (recipe, method, complexity) from
    ``{recipe: {method: [in per level]}}``, a constant standard error, collapsed fractions."""
    recipes = list(coverage_in)
    cov = np.zeros((len(recipes), len(METHODS), len(levels), 2))  # (recipe, method, complexity, region)
    coll = np.zeros((len(recipes), len(METHODS), len(levels), 2))  # ..., repetition
    for i, r in enumerate(recipes):
        for j, m in enumerate(METHODS):
            cov[i, j, :, 0], cov[i, j, :, 1] = coverage_in[r][m], coverage_out[r][m]
            coll[i, j] = collapsed[r][m]
    dims = ("recipe", "method", "complexity")
    coords = {"recipe": recipes, "method": METHODS, "complexity": list(levels), "region": ["in", "out"],
              "repetition": [0, 1]}
    return xr.Dataset({
        "region_coverage": ((*dims, "region"), cov),
        "region_coverage_se": ((*dims, "region"), np.full(cov.shape, se)),
        "collapsed_fraction": ((*dims, "repetition"), coll),
        "fit_r2": ((*dims, "repetition"), 1.0 - coll),
    }, coords=coords, attrs={"complexity_name": "f_main"})


def _flat(value, n=3):
    return [value] * n


def test_findings_verdicts():
    """A recipe reproducing the paper and one with collapsed networks get opposite verdicts."""
    good = {"blr": _flat(0.95), "bd": [0.9, 0.8, 0.7], "cd": [0.9, 0.8, 0.7], "vd": [0.9, 0.8, 0.7],
            "ens": _flat(0.9), "ens_adv": _flat(0.96), "ens_bs": _flat(0.9)}
    bad = {"blr": _flat(0.95), "bd": _flat(0.05), "cd": _flat(0.05), "vd": _flat(0.05), "ens": _flat(0.05),
           "ens_adv": _flat(0.1), "ens_bs": _flat(0.1)}
    out = {m: _flat(0.3) for m in METHODS} | {"blr": _flat(0.95)}
    ds = _summary({"good": good, "bad": bad}, {"good": out, "bad": out},
                  {"good": dict.fromkeys(METHODS, 0.0), "bad": dict.fromkeys(METHODS, 1.0) | {"blr": 0.0}})
    table = findings(ds)
    verdict = {name: {r: v[0] for r, v in row.items()} for name, row in table.items()}
    assert all(v == {"good": True, "bad": True} for k, v in verdict.items() if k.startswith("reference covers"))
    dropout = next(k for k in verdict if k.startswith("dropout variants"))
    assert verdict[dropout] == {"good": True, "bad": False}  # "bad" does not decrease with f_main
    robust = next(k for k in verdict if k.startswith("adversarial and bootstrap"))
    assert verdict[robust] == {"good": True, "bad": False}  # ens_bs 0.9 is within NEAR of 0.95
    assert NEAR == 0.10
    worse = _summary({"r": good | {"ens_bs": _flat(0.84)}}, {"r": out}, {"r": dict.fromkeys(METHODS, 0.0)})
    assert not findings(worse)[robust]["r"][0]
    nearly = next(k for k in verdict if k.startswith("in distribution nearly all"))
    assert verdict[nearly] == {"good": True, "bad": False}
    pre = next(k for k in verdict if k.startswith("(diagnostic) at every complexity most deep networks"))
    assert verdict[pre] == {"good": True, "bad": False}
    fit = next(k for k in verdict if k.startswith("(diagnostic) the deep methods fit the truth"))
    assert verdict[fit] == {"good": True, "bad": False}
    text = findings_table(ds)
    assert text.splitlines()[0] == "| finding (docs/conventions.md#r-4) | good | bad |"
    assert "**holds**" in text and "fails" in text


@pytest.mark.slow
def test_reproduce_recipe_sensitivity_smoke(tmp_path, monkeypatch):
    """The sensitivity studies run as sweeps, draw their figures and write findings.md with a
    column per recipe; a rerun reuses the combined files."""
    assert set(SCALES.names()) == {"paper", "cpu", "smoke"}
    assert set(EXPERIMENTS) >= {"recipes_e1", "recipes_e3"}
    cpu = SCALES.lookup("cpu").studies
    assert len(cpu["recipes_e1"].recipes) >= 3 and cpu["recipes_e1"].complexities == (1, 2, 3)
    assert len(cpu["recipes_e3"].recipes) >= 3 and cpu["recipes_e3"].task == "polynomial"
    paths = reproduce(tmp_path, scale="smoke", experiments=("recipes_e1", "recipes_e3"), progress=False)
    names = sorted(p.name for p in paths)
    assert names == ["fig_recipes_e1.png", "fig_recipes_e3.png", "findings.md"]
    text = (tmp_path / "findings.md").read_text()
    assert "| finding (docs/conventions.md#r-4) | paper | none |" in text
    assert "## recipes_e1" in text and "| recipe | method |" in text
    ds = xr.open_dataset(tmp_path / "recipes_e1" / "study.nc")
    assert list(ds.recipe.values) == ["paper", "none"]
    assert recipe_table(ds).count("\n") == 1 + 2 * ds.sizes["method"]
    again = reproduce(tmp_path, scale="smoke", experiments=("recipes_e1",), progress=False)
    assert [p.name for p in again] == ["fig_recipes_e1.png", "findings.md"]
    # findings.md is written atomically: a write that fails midway (a character UTF-8 cannot
    # encode) leaves the previous one intact and no temporary file (Path.write_text truncated it)
    import uqreg.reproduce

    before = (tmp_path / "findings.md").read_text()
    monkeypatch.setattr(uqreg.reproduce, "recipe_table", lambda ds: "\udcff")
    with pytest.raises(UnicodeEncodeError):
        reproduce(tmp_path, scale="smoke", experiments=("recipes_e1",), progress=False)  # reused: no sweep
    assert (tmp_path / "findings.md").read_text() == before
    assert not list(tmp_path.glob(".findings.md.*"))


def test_a_study_of_another_scale_is_refused_before_any_work(tmp_path):
    """A combined study left in ``OUT/<exp>/study.nc`` by a run at another scale (or by another
    command) is neither reused under this scale's name nor replaced: an error naming the scale,
    the file and what to do, before any sweep runs (no ``cells/`` folder is made)."""
    import uqmetrics

    uqmetrics.write_dataset(xr.Dataset({"x": ("a", [1.0])}, attrs={"reproduce_scale": "smoke"}),
                            tmp_path / "e2" / "study.nc")
    uqmetrics.write_dataset(xr.Dataset({"x": ("a", [1.0])}), tmp_path / "e3" / "study.nc")
    with pytest.raises(uqmetrics.InputError, match=r"--scale cpu: .*e2/study.nc holds a study computed at "
                       r"scale 'smoke'; pass --overwrite to replace it by one at scale 'cpu', or write to "
                       r"another --out"):
        reproduce(tmp_path, scale="cpu", experiments=("e1", "e2"), progress=False)
    with pytest.raises(uqmetrics.InputError, match="e3/study.nc holds a study computed by another command"):
        reproduce(tmp_path, scale="smoke", experiments=("e1", "e3"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2", "e3"]  # e1 never started


def _stub_sweep(monkeypatch, value: float = 2.0) -> list:
    """Replace the sweep by one that records the folder it runs in (the list returned) and
    returns a study of ``value`` recording its configuration as a sweep does (the figures
    stubbed too)."""
    import json

    import uqreg.reproduce
    import uqreg.sweep

    swept = []

    def sweep(cfg, out, **kw):
        swept.append(out.name)
        config = json.dumps(uqreg.sweep.sweep_config(cfg).to_dict())
        return xr.Dataset({"x": ("a", [value])}, attrs={"config": config}), None

    monkeypatch.setattr(uqreg.sweep, "run_study_sweep", sweep)
    monkeypatch.setattr(uqreg.reproduce, "draw_figures", lambda *a: [])
    monkeypatch.setattr(uqreg.reproduce, "draw_recipe_figures", lambda *a: [])
    return swept


def test_a_study_of_another_configuration_or_method_revision_is_refused_unless_overwrite(tmp_path, monkeypatch):
    """A study of the scale asked but computed from another configuration than the scale's now
    (a scale changed since, another device) or by an earlier revision of a method is neither
    reused nor replaced without ``overwrite``: an error naming the file and each field that
    differs, before any sweep runs. Before, every study recording the scale was reused."""
    import dataclasses

    import uqmetrics

    import uqreg.methods

    swept = _stub_sweep(monkeypatch)
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)  # the same: reused
    assert swept == ["e2"]
    studies = SCALES.lookup("smoke").studies
    e2 = studies["e2"]
    monkeypatch.setitem(studies, "e2", dataclasses.replace(e2, train=dataclasses.replace(e2.train, epochs=6)))
    with pytest.raises(uqmetrics.InputError, match=r"--scale smoke: .*e2/study.nc holds a study computed at scale "
                       r"'smoke' from another configuration than this run's \(config.train.epochs 5 \(asked 6\)\); "
                       r"pass --overwrite to replace it"):
        reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)
    assert swept == ["e2"]
    monkeypatch.setitem(studies, "e2", e2)
    revisions = uqreg.methods.method_revisions
    monkeypatch.setattr(uqreg.methods, "method_revisions",
                        lambda names: {**revisions(names), **({"bd": 1} if "bd" in names else {})})
    with pytest.raises(uqmetrics.InputError, match=r'method_revisions.bd \(not recorded\) \(asked 1\)'):
        reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)
    assert swept == ["e2"]
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False, overwrite=True)
    assert swept == ["e2", "e2"]
    ds = uqmetrics.read_dataset(tmp_path / "e2" / "study.nc")
    assert json.loads(ds.attrs["method_revisions"]) == {"bd": 1}
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)  # this revision's: reused
    assert swept == ["e2", "e2"]


def test_a_study_differing_only_in_execution_fields_is_reused(tmp_path, monkeypatch):
    """A study of the scale asked computed with other values of the execution-only training
    fields (``max_memory``, ``chunk_networks``, ``parallel_chunks`` on the CPU, and
    ``cuda_graphs``; :func:`uqreg.study.execution_only_train_fields`) is reused as it is; one that
    also differs in a field a result depends on is refused, naming that field alone. On CUDA,
    where the chunk may change a result's rounding, another ``max_memory`` is another study."""
    import dataclasses

    import uqmetrics

    from uqreg.study import record_identity, reproduce_identity, reproduced_study

    swept = _stub_sweep(monkeypatch)
    studies = SCALES.lookup("smoke").studies
    e2 = studies["e2"]

    def e2_with(**train):
        return dataclasses.replace(e2, train=dataclasses.replace(e2.train, **train))

    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)
    for train in ({"max_memory": 1e9}, {"chunk_networks": 1, "parallel_chunks": 2},
                  {"max_memory": "auto", "chunk_networks": "auto", "parallel_chunks": "auto", "cuda_graphs": True}):
        monkeypatch.setitem(studies, "e2", e2_with(**train))
        reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)  # reused
        assert swept == ["e2"], train
    monkeypatch.setitem(studies, "e2", e2_with(max_memory=1e9, epochs=e2.train.epochs + 1))
    with pytest.raises(uqmetrics.InputError, match=r"from another configuration than this run's \(config.train.epochs "
                       rf"{e2.train.epochs} \(asked {e2.train.epochs + 1}\)\); pass --overwrite"):
        reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False)
    assert swept == ["e2"]
    # on CUDA the chunking fields are part of what a study is computed from
    cuda = e2_with(device="cuda", max_memory=16e9, chunk_networks="auto", parallel_chunks=1)
    ds = xr.Dataset({"x": ("a", [1.0])}, attrs={"reproduce_scale": "smoke", "config": json.dumps(cuda.to_dict())})
    record_identity(ds, reproduce_identity(cuda))
    path = uqmetrics.write_dataset(ds, tmp_path / "cuda" / "study.nc")
    reproduced_study(path, "smoke", identity=reproduce_identity(
        dataclasses.replace(cuda, train=dataclasses.replace(cuda.train, cuda_graphs=True)))).close()
    with pytest.raises(uqmetrics.InputError, match=r"\(config.train.max_memory 16000000000.0 \(asked 1000000000.0\)\)"):
        reproduced_study(path, "smoke", identity=reproduce_identity(
            dataclasses.replace(cuda, train=dataclasses.replace(cuda.train, max_memory=1e9))))


def test_a_study_of_another_scale_is_replaced_under_overwrite(tmp_path, monkeypatch):
    """With ``overwrite`` the study of another scale is computed at the scale asked and written
    over the file (the sweep and the figures stubbed: what is checked is that the study is not
    reused and that the write replaces it)."""
    import uqmetrics


    uqmetrics.write_dataset(xr.Dataset({"x": ("a", [1.0])}, attrs={"reproduce_scale": "cpu"}),
                            tmp_path / "e2" / "study.nc")
    swept = _stub_sweep(monkeypatch)
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False, overwrite=True)
    assert swept == ["e2"]
    ds = uqmetrics.read_dataset(tmp_path / "e2" / "study.nc")
    assert ds.attrs["reproduce_scale"] == "smoke" and ds.x.values.tolist() == [2.0]
    # and a study of the scale asked is reused, overwrite or not
    reproduce(tmp_path, scale="smoke", experiments=("e2",), progress=False, overwrite=True)
    assert swept == ["e2"]
