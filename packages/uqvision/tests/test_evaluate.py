"""``uqvision evaluate FILE``: the whole evaluation of a zoo from one TOML file, resumable.

- ``examples/standin.toml``, as shipped, runs end to end on the stand-in the README makes
  (here at the smallest scale: the session's digits and its trained network, under the names
  the file gives them): the sweep, the four protocols' scores and tables, the site; a rerun
  computes nothing; a protocol added computes that protocol alone; ``--dry-run`` says so; a
  model that fails stops the run before any score file is rewritten with fewer models.
- On a miniature ImageNet-style tree (WordNet-id class folders, ImageNet-C made from its val,
  an OOD folder), each protocol's numbers equal a separate ``uqvision score`` run on the sets
  named explicitly.
- ``examples/imagenet.toml`` declares ImageNet's sets with their roles.
- A bad evaluation file is one line naming the file, the key and the value.

The sweeps run in process on a thread-based Dask cluster, as tests/test_sweep_sets.py's do
(its fixtures are reused); no figure is drawn (``--no-figures``: the figures are the
protocols' own, tested with them).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from test_sweep_sets import _dask_globals_kept, client  # noqa: F401  (fixtures)
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import make_subset_folder, make_synthetic_folder
from uqvision.data.corruptions import make_corrupted_folder
from uqvision.evaluate import read_evaluation
from uqvision.models import read_sidecar

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SCORED = ("selective", "shift", "ood", "conformal")


def _checkpoint(trained, models: Path, stem: str, classes: list[str] | None = None) -> None:
    """The session's trained network as ``models/<stem>.safetensors`` (and its sidecar), its
    class names renamed to ``classes`` where given (a network of those folders' classes)."""
    models.mkdir(parents=True, exist_ok=True)
    shutil.copy(trained.checkpoint, models / f"{stem}.safetensors")
    sidecar = read_sidecar(trained.checkpoint)
    if classes is not None:
        sidecar["classes"] = classes
    (models / f"{stem}.json").write_text(json.dumps(sidecar))


def _evaluate(toml: Path, client, *extra: str) -> int:  # noqa: F811  (the fixture's name)
    return main(["evaluate", str(toml), "--scheduler", client.scheduler.address,
                 "--no-figures", *extra])


def _mtimes(out: Path, *folders: str) -> dict[str, int]:
    """File -> modification time, below ``out`` (only in ``folders`` where given)."""
    paths = [p for f in folders for p in (out / f).rglob("*")] if folders else out.rglob("*")
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in paths if p.is_file()}


@pytest.fixture(scope="module")
def standin(digits, trained, tmp_path_factory):
    """The repository layout examples/standin.toml reads, at the smallest scale: the file
    itself in examples/, data/ (digits, its fit subset, one ImageNet-C member made from its
    test split, a folder of noise) and models/ (two copies of the trained network)."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "examples").mkdir()
    shutil.copy(EXAMPLES / "standin.toml", repo / "examples")
    data = repo / "data"
    data.mkdir()
    (data / "digits").symlink_to(digits)
    make_subset_folder(data / "digits-fit", src=digits / "train", n_per_class=2)
    make_corrupted_folder(digits / "test", data / "digits-c", corruptions=("brightness",),
                          severities=(1,), resize=32, crop=32, progress=False)
    make_synthetic_folder(data / "noise", n_classes=1, n_per_class=6, image_size=16)
    for k in (0, 1):
        _checkpoint(trained, repo / "models", f"byobnet-{k}")
    return repo


def _without(text: str, *protocols: str) -> str:
    """An evaluation file's text without the tables of ``protocols``."""
    for name in protocols:
        head, _, rest = text.partition(f"[protocols.{name}]")
        text = head + (rest[rest.index("\n["):] if "\n[" in rest else "")
    return text


def _scored(printed: str) -> list[str]:
    return [line.split(":")[0][6:] for line in printed.splitlines() if line.startswith("score ")]


def test_standin_runs_end_to_end_resumes_and_adds_a_protocol_alone(standin, client, capsys):  # noqa: F811
    shipped = standin / "examples" / "standin.toml"
    text = shipped.read_text()
    assert all(f"[protocols.{name}]" in text for name in SCORED)
    out = standin / "examples" / "results" / "standin"
    # the same evaluation without some protocols, beside it (same paths, same output folder)
    partial = shipped.with_name("partial.toml")

    partial.write_text(_without(text, "ood", "conformal"))
    assert _evaluate(partial, client) == 0
    first = capsys.readouterr().out
    # 2 models x (test, the one ImageNet-C member): fit and noise, which no protocol there
    # reads, are not predicted; no embedding anywhere
    assert "sweep: computed 4, skipped 0" in first
    assert "set fit: role fit, read by none of the protocols chosen: not predicted" in first
    assert _scored(first) == ["selective", "shift"]
    for name in ("selective", "shift"):
        assert (out / "scores" / f"{name}.csv").is_file()  # its headline table
    assert (out / "site" / "index.html").is_file()
    with xr.open_dataset(out / "scores" / "shift.nc") as ds:  # the declared ensemble's row
        assert "byobnet" in [str(m) for m in ds["model"].values]
    shifted = _mtimes(out, "caches")
    assert all("imagenet-c" in k or ".test." in k for k in shifted)

    # the OOD protocol added: its sets, and its detectors' variables on the test set only
    partial.write_text(_without(text, "conformal"))
    assert _evaluate(partial, client) == 0
    second = capsys.readouterr().out
    assert "2 cache(s) lack a variable the protocols now read: recomputed with it" in second
    assert "sweep: computed 6, skipped 2" in second  # test again, fit, noise; not ImageNet-C
    assert {k: v for k, v in _mtimes(out, "caches").items() if "imagenet-c" in k} == {
        k: v for k, v in shifted.items() if "imagenet-c" in k}
    for dataset, features in (("test", True), ("fit", True), ("noise", True),
                              ("imagenet-c-brightness-1", False)):
        with xr.open_dataset(out / "caches" / f"test_byobnet+byobnet-0.{dataset}.plain-000.nc"
                             ) as ds:
            assert ("embedding" in ds, "head_weight" in ds) == (features, features), dataset
    # ood computed; selective and shift again: the test caches they read were recomputed
    assert _scored(second) == ["selective", "shift", "ood"]
    assert "score selective: the caches it reads changed" in second
    before, everything = _mtimes(out, "caches", "scores"), _mtimes(out)

    # the shipped file adds conformal: the dry run says what, the run computes that alone
    assert main(["evaluate", str(shipped), "--no-figures", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "cells: 0 to compute, 8 complete on disk" in dry
    assert "score conformal: to compute (no score file)" in dry
    for name in ("selective", "shift", "ood"):
        assert f"score {name}: up to date" in dry
    assert _mtimes(out) == everything  # the dry run wrote nothing

    assert _evaluate(shipped, client) == 0
    third = capsys.readouterr().out
    assert "sweep: computed 0, skipped 8" in third
    # its table (RAPS's Table 1): the headline columns a terminal holds, the rest in the CSV
    assert _scored(third) == ["conformal"] and "coverage_median" in third
    assert re.search(r"\(\d+ of \d+ columns shown; all \d+: .*conformal\.csv\)", third), third
    now = _mtimes(out, "caches", "scores", "site")
    assert {k: now[k] for k in before} == before  # nothing else recomputed or rewritten
    pages = sorted(p.name for p in (out / "site").glob("*.html"))
    assert all(f"{name}.html" in pages for name in SCORED), pages

    # a rerun computes nothing
    assert _evaluate(shipped, client) == 0
    fourth = capsys.readouterr().out
    assert "sweep: computed 0, skipped 8" in fourth and "nothing to compute" in fourth
    assert not _scored(fourth) and "site:" not in fourth
    assert _mtimes(out, "caches", "scores", "site") == now

    # a model that fails stops the run before any score file is rewritten with fewer models
    (standin / "models" / "broken.safetensors").write_bytes(b"not a checkpoint")
    partial.write_text(text.replace("models = [", 'models = ["test_byobnet=models/broken.'
                                                  'safetensors", '))
    assert _evaluate(partial, client) == 1
    fifth = capsys.readouterr().out
    assert "FAILED test_byobnet@broken: " in fifth and "nothing is scored" in fifth
    assert not _scored(fifth)
    assert _mtimes(out, "scores", "site") == {k: v for k, v in now.items()
                                              if k.startswith(("scores", "site"))}

    # a score file there that the evaluation did not write is refused, before any work
    other = standin / "other"
    (other / "scores").mkdir(parents=True)
    (other / "scores" / "shift.nc").write_bytes(b"someone's")
    assert main(["evaluate", str(shipped), "--out", str(other), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "shift.nc' exists and was not written by this evaluation" in err, err
    assert err.count("\n") == 1 and not (other / "caches").exists()


@pytest.mark.parametrize("name", ["../../victim.nc", "/abs/victim.nc", ".replaced", 7])
def test_a_state_file_naming_caches_outside_the_caches_folder_is_refused(standin, name, capsys):
    """The state file is data (an output folder may come from another user): the cache names
    of a set are moved aside and back when its caches are recomputed, so a name that is not a
    plain file name of ``caches/`` is refused before any work, and nothing is moved."""
    out = standin / "poisoned"
    (out / "caches").mkdir(parents=True, exist_ok=True)
    victim = standin / "victim.nc"
    victim.write_bytes(b"someone's")
    state = {"sets": {"test": {"role": "fit", "caches": ["a.nc", name]}}}
    (out / "evaluate.state.json").write_text(json.dumps(state))
    assert main(["evaluate", str(standin / "examples" / "standin.toml"), "--out", str(out),
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"evaluate.state.json' records the cache {name!r}, which is not a file name of " \
        "the caches folder" in err and err.count("\n") == 1, err
    assert victim.read_bytes() == b"someone's" and not (out / "caches" / ".replaced").exists()


def test_a_set_whose_role_changed_has_its_caches_recomputed_and_its_scores_redone(
        digits, trained, client, tmp_path, capsys):  # noqa: F811
    """A set's role is recorded in its caches (``set_role``) but is not part of their
    identity: a set the file now declares in another role (an OOD test set made the OOD
    validation set) has its caches recomputed and the scores that read it redone, never
    left scoring it in the role it had (the validation set among the test OOD sets)."""
    _checkpoint(trained, tmp_path / "models", "a")
    for seed, name in enumerate(("near", "held")):  # two sets: other images
        make_synthetic_folder(tmp_path / name, n_classes=1, n_per_class=4, image_size=16,
                              seed=seed)
    toml = tmp_path / "e.toml"
    text = f"""
out = "out"
models = ["test_byobnet=models/a.safetensors"]
[sets.test]
role = "test"
path = "{digits / 'test'}"
[sets.near]
role = "ood-far"
path = "near/test"
[sets.held]
role = "ood-far"
path = "held/test"
[protocols.ood]
detectors = ["msp"]
"""
    toml.write_text(text)
    assert _evaluate(toml, client) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    with xr.open_dataset(out / "scores" / "ood.nc") as ds:
        assert sorted(str(v) for v in ds["ood_set"].values) == ["held", "near"]

    toml.write_text(text.replace('role = "ood-far"\npath = "held/test"',
                                 'role = "ood-val"\nset = "ood-far"\npath = "held/test"'))
    assert main(["evaluate", str(toml), "--no-figures", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "set held: its caches record role 'ood-far', the file gives it role 'ood-val'" in dry
    assert "cells: 1 to compute, 2 complete" in dry  # the recast cache counted as the run does
    assert "score ood: to compute" in dry
    assert _evaluate(toml, client) == 0
    printed = capsys.readouterr().out
    assert "sweep: computed 1, skipped 2" in printed and _scored(printed) == ["ood"]
    with xr.open_dataset(out / "caches" / "test_byobnet+a.held.plain-000.nc") as ds:
        assert ds.attrs["set_role"] == "ood-val"
    with xr.open_dataset(out / "scores" / "ood.nc") as ds:  # the validation set is not a test
        assert [str(v) for v in ds["ood_set"].values] == ["near"]
    assert not (out / "caches" / ".replaced").exists()

    # a state written before roles were recorded: the role its caches record is read
    state = json.loads((out / "evaluate.state.json").read_text())
    for record in state["sets"].values():
        del record["role"]
    (out / "evaluate.state.json").write_text(json.dumps(state))
    toml.write_text(text)
    assert _evaluate(toml, client) == 0
    printed = capsys.readouterr().out
    assert "set held: its caches record role 'ood-val', the file gives it role 'ood-far'" \
        in printed and "sweep: computed 1, skipped 2" in printed
    with xr.open_dataset(out / "scores" / "ood.nc") as ds:
        assert sorted(str(v) for v in ds["ood_set"].values) == ["held", "near"]


# -- a miniature ImageNet ------------------------------------------------------------------------

#: ImageNet's first ten WordNet ids (sorted as the digits 0-9 they stand for here).
WNIDS = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475", "n01496331",
         "n01498041", "n01514668", "n01514859", "n01518878"]


def _wordnet_copy(src: Path, dst: Path) -> Path:
    for k, wnid in enumerate(WNIDS):
        shutil.copytree(src / str(k), dst / wnid)
    return dst


def test_each_protocols_numbers_equal_a_score_run_on_named_sets(digits, trained, client,  # noqa: F811
                                                               tmp_path, capsys):
    root = tmp_path / "imagenet"
    val = _wordnet_copy(digits / "test", root / "val")
    fit = make_subset_folder(root / "fit", src=_wordnet_copy(digits / "train", root / "train"),
                             n_per_class=2)
    make_corrupted_folder(val, root / "imagenet-c", corruptions=("contrast",), severities=(2,),
                          resize=32, crop=32, progress=False)
    make_synthetic_folder(root / "openimage-o", n_classes=1, n_per_class=6, image_size=16)
    for stem in ("a", "b"):
        _checkpoint(trained, tmp_path / "models", stem, WNIDS)
    toml = tmp_path / "mini.toml"
    toml.write_text(f"""
out = "out"
models = ["test_byobnet=models/a.safetensors", "test_byobnet=models/b.safetensors"]
[sets.val]
role = "test"
path = "{val}"
[sets.fit]
role = "fit"
path = "{fit}"
[sets.imagenet-c]
path = "{root / 'imagenet-c'}"
[sets.openimage-o]
path = "{root / 'openimage-o' / 'test'}"
[ensembles]
ab = ["test_byobnet@a", "test_byobnet@b"]
[protocols.selective]
calibration-size = 0.3
[protocols.shift]
calibration-size = 0.4
[protocols.ood]
detectors = ["msp", "energy", "mahalanobis"]
[protocols.conformal]
trials = 5
alphas = [0.1, 0.2]
""")
    assert _evaluate(toml, client) == 0
    capsys.readouterr()
    out, caches = tmp_path / "out", tmp_path / "out" / "caches"
    separate = {
        "selective": ["--test", "val", "--calibration-size", "0.3"],
        "shift": ["--test", "val", "--calibration-size", "0.4", "--ensemble",
                  "ab=test_byobnet@a,test_byobnet@b"],
        "ood": ["--test", "val", "--fit", "fit", "--detectors", "msp", "energy", "mahalanobis",
                "--ensemble", "ab=test_byobnet@a,test_byobnet@b"],
        "conformal": ["--test", "val", "--trials", "5", "--alphas", "0.1", "0.2",
                      "--ensemble", "ab=test_byobnet@a,test_byobnet@b"],
    }
    for name, options in separate.items():
        alone = tmp_path / "alone" / f"{name}.nc"
        assert main(["score", name, "--caches", str(caches), "--out", str(alone),
                     *options]) == 0, capsys.readouterr().err
        with xr.open_dataset(out / "scores" / f"{name}.nc") as got, \
                xr.open_dataset(alone) as want:
            assert sorted(got.data_vars) == sorted(want.data_vars), name
            for var in want.data_vars:
                np.testing.assert_array_equal(got[var].values, want[var].values,
                                              err_msg=f"{name} {var}")
            for dim in want.dims:
                assert list(got[dim].values) == list(want[dim].values), (name, dim)
    with xr.open_dataset(out / "scores" / "ood.nc") as ds:  # the OOD set is far, by its set
        assert "openimage-o" in [str(v) for v in ds["ood_set"].values]
        assert np.isfinite(ds["far_auroc"].values).any()
    with xr.open_dataset(out / "scores" / "shift.nc") as ds:  # made from val, scored as shift
        assert list(ds["corruption"].values) == ["contrast"]
        assert list(ds["model"].values) == ["test_byobnet@a", "test_byobnet@b", "ab"]


def test_the_imagenet_example_declares_every_set_with_its_role(tmp_path):
    """examples/imagenet.toml, its root set to a tree of its paths: val, V2, ImageNet-C,
    Sketch, A, R, ReaL, OpenOOD's five OOD sets (near and far) and the fit subset."""
    text = (EXAMPLES / "imagenet.toml").read_text()
    assert 'root = "/datasets"' in text
    toml = tmp_path / "examples" / "imagenet.toml"
    toml.parent.mkdir()
    toml.write_text(text.replace('root = "/datasets"', f'root = "{tmp_path / "datasets"}"'))
    for line in text.splitlines():
        if line.startswith(("path = ", "overlay = ")):
            path = tmp_path / "datasets" / line.split('"')[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.touch() if path.suffix in (".txt", ".json") else
             path.mkdir(parents=True, exist_ok=True))
    ev = read_evaluation(toml)
    assert {s.name: (s.role, s.eval_set) for s in ev.sets} == {
        "val": ("test", "folder"), "fit": ("fit", "folder"),
        "imagenet-c": ("shift", "imagenet-c"), "imagenet-v2": ("shift", "imagenet-v2"),
        "imagenet-sketch": ("shift", "imagenet-sketch"), "imagenet-a": ("shift", "imagenet-a"),
        "imagenet-r": ("shift", "imagenet-r"), "real": ("shift", "imagenet-real"),
        "ssb-hard": ("ood-near", "ssb-hard"), "ninco": ("ood-near", "ninco"),
        "inaturalist": ("ood-far", "inaturalist"), "textures": ("ood-far", "textures"),
        "openimage-o": ("ood-far", "openimage-o")}
    assert list(ev.protocols) == list(SCORED) and ev.zoos == ("selective-paper",)
    assert f"--overlay={tmp_path / 'datasets' / 'imagenet' / 'real.json'}" in \
        ev.protocols["shift"]
    assert ev.out == tmp_path / "examples" / "results" / "imagenet"


# -- the file checked at the boundary ------------------------------------------------------------

BASE = """
out = "out"
models = ["test_byobnet"]
[sets.test]
role = "test"
path = "data"
[protocols.selective]
"""


@pytest.mark.parametrize("text, message", [
    (BASE + "calibration-sise = 0.3\n",
     "[protocols.selective]: key 'calibration-sise' = 0.3: unknown key; known: "),
    (BASE + "calibration-size = \"big\"\n",
     "[protocols.selective]: argument --calibration-size: "),
    (BASE + "test = \"other\"\n",
     "[protocols.selective]: key 'test' = \"other\": the evaluation gives it itself"),
    (BASE.replace('role = "test"', 'role = "tset"'),
     "[sets.test]: key 'role' = \"tset\": not a role; roles: calibration, test, fit"),
    (BASE.replace('path = "data"', 'path = "nowhere"'),
     "[sets.test]: key 'path' = \"nowhere\": "),
    (BASE + "[protocols.selectiv]\n", "[protocols.selectiv]: unknown score protocol "),
    (BASE.replace('["test_byobnet"]', '["test_byobnet", "test_vit", "test_byobnet"]'),
     "key 'models': ['test_byobnet', 'test_byobnet'] give the same result row ['test_byobnet']"),
    (BASE + "[sets.c]\nrole = \"shift\"\nset = \"ninco\"\npath = \"data\"\n",
     "[sets.c]: key 'role' = \"shift\": eval set 'ninco' "),
    (BASE + "[sets.fit]\nrole = \"fit\"\npath = \"data\"\n[ensembles]\ne = [\"test_byobnet\"]\n",
     "[ensembles] e = [\"test_byobnet\"]: an ensemble needs two or more distinct members"),
    (BASE + "[predict]\nembeddings = true\n",
     "[predict]: key 'embeddings' = true: the evaluation gives it itself"),
    (BASE + "[predict]\nbatch-size = 0\n", "[predict]: argument --batch-size: "),
    (BASE + "[predict]\nweights-dir = \"weigths\"\n",
     "[predict]: key 'weights-dir' = \"weigths\": "),
    ("modles = []\n" + BASE, "unknown key 'modles' = []; an evaluation file has out, "),
    (BASE.replace('role = "test"', 'role = "fit"'), "no set of role 'test'"),
])
def test_a_bad_file_is_one_line_naming_file_key_and_value(tmp_path, text, message, capsys):
    toml = tmp_path / "e.toml"
    toml.write_text(text)
    (tmp_path / "data").mkdir()
    with pytest.raises(InputError) as exc:
        read_evaluation(toml)
    assert str(exc.value).startswith(str(toml)) and message in str(exc.value), str(exc.value)
    assert main(["evaluate", str(toml), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision evaluate: error: ") and err.count("\n") == 1, err
