"""``uqvision sweep --sets EVALSET=PATH ...``: every model predicts every extra evaluation set
(each member of an expanded one) once, as ``uqvision predict --eval-set`` does, into the
sweep's caches; a sweep interrupted by Ctrl-C resumes to the caches of an uninterrupted one
without recomputing the complete ones; bad values are refused before any model runs.

The sweeps run in process on a thread-based Dask cluster (``--scheduler`` of the command line,
``client=`` of the library), as tests/test_sweep.py's do.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics.runs.sweep import is_complete
from uqmetrics.runs.testing.signals import sigint_raises

from uqvision.cli import main
from uqvision.data import make_digits_folder
from uqvision.data.corruptions import make_corrupted_folder
from uqvision.predict import PredictConfig
from uqvision.sweep import dry_run_sweep, sweep_predictions

#: Two cheap corruptions at two severities: four imagenet-c members.
CORRUPTIONS, SEVERITIES = ("brightness", "contrast"), (1, 3)
MEMBERS = [f"{c}-{s}" for c in CORRUPTIONS for s in SEVERITIES]
#: A random-init test network beside the trained checkpoint of conftest.py.
RANDOM = "test_byobnet"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """--data (15 digit images), its imagenet-c (4 members, 32 px) and one plain set."""
    root = make_digits_folder(tmp_path_factory.mktemp("sets") / "digits", max_per_class=3)
    corrupted = make_corrupted_folder(root / "test", root.parent / "imagenet-c",
                                      corruptions=CORRUPTIONS, severities=SEVERITIES,
                                      resize=32, crop=32, progress=False)
    return {"data": root / "test", "imagenet-c": corrupted, "sketch": root / "train"}


def _sets(folders) -> list[str]:
    return [f"imagenet-c={folders['imagenet-c']}", f"imagenet-sketch={folders['sketch']}"]


def _models(spec) -> list[str]:
    return [spec, RANDOM]


CONFIG = PredictConfig(batch_size=32, allow_random_init=True, num_workers=0)


@pytest.fixture(autouse=True)
def _dask_globals_kept():
    """dask's global ``scheduler`` setting and default clients as they were before each test:
    a thread-based cluster closed while one of its tasks runs (the Ctrl-C test) can leave its
    closed client registered as the default one, which xarray's netCDF writes then ask for
    (``ConnectionPool is closed``) in the tests after that one. Test hygiene only: a sweep's
    own cluster runs in processes."""
    import dask
    import distributed.client as dc

    before = dask.config.get("scheduler", None)
    yield
    for c in list(dc._global_clients.values()):
        if c.status != "running":  # closed, or still "connecting" to a cluster now gone
            dc._del_global_client(c)
    if before is None:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.set(scheduler=before)


@pytest.fixture(scope="module")
def client():
    from dask.distributed import Client, LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def swept(spec, folders, client, tmp_path_factory):
    """An uninterrupted sweep with the sets: its caches folder and report."""
    caches = tmp_path_factory.mktemp("swept") / "caches"
    report = sweep_predictions(_models(spec), folders["data"], caches, CONFIG, client=client,
                               threads=1, sets=_sets(folders))
    return caches, report


def _keys(spec) -> dict[str, tuple[str, str | None]]:
    """Cache file name -> (eval set, member) of every (model, folder) of the sweep."""
    rows = ["test_byobnet+m0", RANDOM]
    sets = [("test", "folder", None), ("train", "imagenet-sketch", None),
            *[(f"imagenet-c-{m}", "imagenet-c", m) for m in MEMBERS]]
    return {f"{row}.{name}.plain-000.nc": (es, m) for row in rows for name, es, m in sets}


def _logits(caches: Path) -> dict[str, np.ndarray]:
    out = {}
    for p in sorted(caches.glob("*.nc")):
        with xr.open_dataset(p) as ds:
            out[p.name] = ds["logits"].values.copy()
    return out


def test_every_model_predicts_every_member_once_with_its_set_recorded(spec, folders, swept,
                                                                      client):
    caches, report = swept
    want = _keys(spec)
    assert not report.failed and sorted(p.name for p in report.computed) == sorted(want)
    for name, (eval_set, member) in want.items():
        with xr.open_dataset(caches / name) as ds:
            a = ds.attrs
            assert (a["eval_set"], a.get("eval_member")) == (eval_set, member), name
            if member is not None:
                corruption, severity = member.rsplit("-", 1)
                assert (a["corruption"], int(a["severity"])) == (corruption, int(severity))
                assert a["role"] == "shifted" and ds.sizes["sample"] == 15
            else:
                assert "corruption" not in a
    # the V.1 scoring sees the --data's caches only
    assert sorted(p.name for p in report.of_dataset("test").paths) == [
        "test_byobnet+m0.test.plain-000.nc", "test_byobnet.test.plain-000.nc"]
    # a rerun computes nothing
    again = sweep_predictions(_models(spec), folders["data"], caches, CONFIG, client=client,
                              threads=1, sets=_sets(folders))
    assert again.computed == [] and len(again.skipped) == len(want)


def test_a_member_cache_is_the_one_uqvision_predict_writes(spec, folders, swept, tmp_path,
                                                           capsys):
    """The sweep's cell goes through predict's path: ``uqvision predict --eval-set imagenet-c
    --eval-member contrast-3`` on that member folder writes the same cache (logits bit-equal,
    same identity)."""
    caches, _ = swept
    member = folders["imagenet-c"] / "contrast" / "3"
    assert main(["--threads", "1", "predict", "--model", spec, "--data", str(member), "--out",
                 str(tmp_path), "--eval-set", "imagenet-c", "--eval-member", "contrast-3",
                 "--batch-size", "32"]) == 0
    capsys.readouterr()
    name = "test_byobnet+m0.imagenet-c-contrast-3.plain-000.nc"
    assert [p.name for p in tmp_path.glob("*.nc")] == [name]
    with xr.open_dataset(tmp_path / name) as mine, xr.open_dataset(caches / name) as swept_ds:
        np.testing.assert_array_equal(mine["logits"].values, swept_ds["logits"].values)
        for key in ("eval_set", "eval_member", "corruption", "severity", "dataset_name",
                    "dataset_fingerprint", "checkpoint_sha256"):
            assert mine.attrs[key] == swept_ds.attrs[key], key


def test_a_sweep_interrupted_by_ctrl_c_resumes_to_the_same_caches(spec, folders, swept, client,
                                                                  tmp_path):
    """Ctrl-C (SIGINT, what a terminal sends) after a few cells: the complete caches stay and
    are not recomputed by the rerun; the caches at the end are those of the uninterrupted
    sweep (same files, logits bit-equal); no temporary file stays."""
    from dask.distributed import Client, LocalCluster

    caches = tmp_path / "caches"
    stop = threading.Event()

    def interrupt_after(n: int) -> None:
        # a cache appears under its name once written whole (write, then rename); its file
        # is not opened here: netCDF/HDF5 is not safe to call from two threads at once
        while not stop.is_set():
            if len(list(caches.glob("*.nc"))) >= n:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=interrupt_after, args=(3,), daemon=True)
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as own:
        watcher.start()
        try:  # the watcher's SIGINT raises here even where the tests run with it ignored (nohup)
            with sigint_raises(), pytest.raises(KeyboardInterrupt):
                sweep_predictions(_models(spec), folders["data"], caches, CONFIG, client=own,
                                  threads=1, sets=_sets(folders))
        finally:
            stop.set()
            watcher.join()
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in caches.glob("*.nc")
            if is_complete(p)}
    total = len(_keys(spec))
    assert 3 <= len(done) < total, sorted(done)

    report = sweep_predictions(_models(spec), folders["data"], caches, CONFIG, client=client,
                               threads=1, sets=_sets(folders))
    assert not report.failed
    assert sorted(p.name for p in report.skipped) == sorted(done)
    assert len(report.computed) == total - len(done)
    assert {name: (caches / name).stat().st_ino for name in done} == {
        name: ino for name, (ino, _) in done.items()}
    assert {name: (caches / name).stat().st_mtime_ns for name in done} == {
        name: t for name, (_, t) in done.items()}
    want = _logits(swept[0])
    got = _logits(caches)
    assert sorted(got) == sorted(want) == sorted(_keys(spec))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert not [p.name for p in caches.iterdir() if p.name.endswith(".tmp")]


def test_dry_run_lists_the_set_predictions(spec, folders, swept, tmp_path, capsys):
    """Every set and member in the listing with its cells to compute and complete; nothing
    written."""
    caches, _ = swept
    dry = dry_run_sweep(_models(spec), folders["data"], caches, CONFIG, sets=_sets(folders),
                        probe=False)
    assert dry.cells_to_compute == 0 and dry.cells_complete == len(_keys(spec))
    assert [(s["eval_set"], s["member"]) for s in dry.sets] == [
        *[("imagenet-c", m) for m in MEMBERS], ("imagenet-sketch", None)]
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", spec, RANDOM, "--random-init",
                 "--data", str(folders["data"]), "--out", str(out), "--calibration-size",
                 "0.3", "--sets", *_sets(folders), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    c, sketch = _sets(folders)
    assert (f"  set {c}: 4 member(s) (brightness-1, brightness-3, contrast-1, contrast-3), "
            "15 images each; 8 cell(s) to compute, 0 complete (skipped)") in lines
    assert f"  set {sketch}: 15 images; 2 cell(s) to compute, 0 complete (skipped)" in lines
    assert any(ln.startswith("cost: 12 cell(s) = 180 image-cells (2 × 15 images of the data, "
                             "10 of the sets); ") for ln in lines), lines
    assert not out.exists()


@pytest.mark.parametrize(("value", "message"), [
    ("imagenet-cc={c}", ("--sets 'imagenet-cc={c}': unknown evaluation set 'imagenet-cc'; "
                        "known: folder, ")),
    ("imagenet-r={c}/absent", "--sets 'imagenet-r={c}/absent': '{c}/absent' does not exist"),
    ("imagenet-r", "--sets 'imagenet-r': not EVALSET=PATH"),
    ("={c}", "--sets '={c}': not EVALSET=PATH"),
    ("imagenet-c={data}", ("--sets 'imagenet-c={data}': '{data}' holds no member folder of "
                          "eval set 'imagenet-c'")),
    ("imagenet-r={data}", ("--sets 'imagenet-r={data}': its dataset name 'test' (the caches' "
                          "file names) is --data's too")),
    ("imagenet-c:c={c}", ("--sets 'imagenet-c:c={c}': a dataset name is for a set of one "
                         "folder")),
])
def test_a_bad_set_is_one_line_naming_it_before_any_model_runs(folders, tmp_path, capsys,
                                                               value, message):
    fill = {"c": str(folders["imagenet-c"]), "data": str(folders["data"])}
    value, message = value.format(**fill), message.format(**fill)
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(folders["data"]), "--out", str(out), "--calibration-size", "0.3",
                 "--sets", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision sweep: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (out / "caches").exists()


def test_the_command_predicts_the_sets_and_scores_the_data_only(spec, folders, tmp_path,
                                                                client, capsys):
    """``uqvision sweep --sets``: the set caches in OUT/caches, the selective scores and the
    results table of --data only (as without --sets)."""
    out = tmp_path / "s"
    addr = client.scheduler.address
    common = ["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
              str(folders["data"]), "--calibration-size", "0.3", "--scheduler", addr]
    assert main([*common, "--out", str(out), "--sets", _sets(folders)[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "computed 2, skipped 0 (already complete), failed 0 model(s)" in lines
    assert sorted(p.name for p in (out / "caches").glob("*.nc")) == [
        f"{RANDOM}.test.plain-000.nc", f"{RANDOM}.train.plain-000.nc"]
    assert sorted(p.name for p in (out / "scores").glob("*.nc")) == ["selective-test.nc"]
    with xr.open_dataset(out / "scores" / "selective-test.nc") as ds:
        scored = {k: ds[k].values.copy() for k in ds.data_vars}
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    with xr.open_dataset(tmp_path / "plain" / "scores" / "selective-test.nc") as ds:
        for k in ds.data_vars:
            np.testing.assert_array_equal(ds[k].values, scored[k], err_msg=k)
    assert _table(out) == _table(tmp_path / "plain")


def _table(out: Path) -> list[dict]:
    """The results table of --data, without its timings."""
    import csv

    with open(out / "scores" / "results-test.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in ("images_per_s", "wall_time_s")}
                for row in csv.DictReader(f)]


def test_a_set_of_the_data_folder_takes_a_dataset_name(folders):
    """ReaL relabels the --data folder itself: ``imagenet-real:real=PATH`` names its caches."""
    from uqvision.data import ImageFolderDataset
    from uqvision.predict import PredictConfig
    from uqvision.sweep import sweep_targets

    data = ImageFolderDataset(folders["data"])
    targets = sweep_targets(data, PredictConfig(), [f"imagenet-real:real={folders['data']}"])
    assert [(t.dataset_name, t.config.eval_set) for t in targets] == [
        ("test", "folder"), ("real", "imagenet-real")]
    assert targets[1].folder.root == targets[0].folder.root


def test_two_expanded_sets_of_one_kind_are_refused_with_the_reason(folders, tmp_path, capsys):
    """The members of an expanded set are named <set>-<member> whatever the set's own name, so
    two ImageNet-C folders (an official and a remade one) cannot share a caches folder: the
    refusal says so (before, it suggested ``imagenet-c:NAME=PATH``, which an expanded set
    refuses)."""
    c = str(folders["imagenet-c"])
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(folders["data"]), "--out", str(out), "--calibration-size", "0.3",
                 "--sets", f"imagenet-c={c}", f"shift:imagenet-c={c}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"uqvision sweep: error: --sets 'shift:imagenet-c={c}': its member 'brightness-1' is "
        f"named 'imagenet-c-brightness-1' (the caches' file names: <set>-<member>), as --sets "
        f"'imagenet-c={c}''s; two imagenet-c sets cannot share one caches folder") in err, err
    assert not (out / "caches").exists()
