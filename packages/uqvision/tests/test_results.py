"""The results table (docs/conventions.md#v-1-table): every column against numpy by hand on a
real cache set (the conftest's trained test_byobnet, plain and MC dropout, and a random-init
one, on the digits folder), the score file's numbers, the files and the commands."""

import csv
import json
import math

import numpy as np
import pytest
import timm
from uqmetrics import read_dataset

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.predict import PredictConfig, predict_to_files
from uqvision.protocols.selective.score import SelectiveConfig, score_selective
from uqvision.results import COLUMNS, ResultsTable, results_table

PASSES = 3
TIMM_COLUMNS = ("model", "top1", "top5", "param_count", "img_size", "crop_pct", "interpolation")


@pytest.fixture(scope="module")
def zoo(spec, digits, tmp_path_factory):
    """Caches folder: the trained model (plain, MC dropout with 3 passes) and a random-init
    test_byobnet (plain, 160 px from timm's config)."""
    out = tmp_path_factory.mktemp("zoo") / "caches"
    predict_to_files(spec, digits / "test", out, PredictConfig(batch_size=32))
    predict_to_files(spec, digits / "test", out, PredictConfig(mode="mc_dropout",
                                                              passes=PASSES, batch_size=32))
    predict_to_files("test_byobnet", digits / "test", out,
                     PredictConfig(batch_size=32, allow_random_init=True))
    return out


def _caches(folder):
    """Row label -> (cache Dataset, probabilities (sample, class) by numpy, labels)."""
    out = {}
    for path in sorted(folder.glob("*.nc")):
        ds = read_cache(path)
        z = ds["logits"].values.astype(np.float64)
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        label = ds.attrs["model"]
        if ds.attrs["mode"] == "mc_dropout":
            label, p = label + "+mc_dropout", p.mean(axis=0)
        out[label] = ds, p, ds["label"].values
    return out


def _by_hand(p, y, kappa):
    """top1, top5 (percent), AUROC, AURC and ECE (15 equal-width bins) with numpy alone."""
    order = np.argsort(-p, axis=1, kind="stable")
    correct = order[:, 0] == y
    top5 = (order[:, :5] == y[:, None]).any(axis=1)
    assert np.unique(kappa).size == kappa.size  # no ties: the plain formulas below hold
    pos, neg = kappa[correct], kappa[~correct]
    auroc = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) \
        / (pos.size * neg.size)
    errors = np.cumsum(~correct[np.argsort(-kappa)])
    aurc = np.mean(errors / np.arange(1, y.size + 1))
    conf = p.max(axis=1)
    bins = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)  # (j/15, (j+1)/15]
    ece = sum(np.sum(bins == j) / y.size * abs(correct[bins == j].mean() - conf[bins == j].mean())
              for j in range(15) if np.any(bins == j))
    return {"top1": 100 * correct.mean(), "top5": 100 * top5.mean(), "auroc": auroc,
            "aurc": aurc, "ece": ece}


def _kappa(label, p):
    if label.endswith("+mc_dropout"):  # negative entropy of the mean over passes
        return np.sum(p * np.log(p), axis=1)
    return p.max(axis=1)  # softmax response


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def test_every_column_equals_numpy_by_hand(zoo, spec):
    table = results_table([zoo], config=SelectiveConfig(mc_passes=PASSES))
    caches = _caches(zoo)
    assert sorted(table.column("model")) == sorted(caches)
    assert len(table) == 3 and table.source == "caches"
    n_params = {"test_byobnet@m0": timm.create_model("test_byobnet", num_classes=10),
                "test_byobnet": timm.create_model("test_byobnet", num_classes=10)}
    for row in table.rows:
        ds, p, y = caches[row["model"]]
        want = _by_hand(p, y, _kappa(row["model"], p))
        if row["model"].endswith("+mc_dropout"):
            assert math.isnan(row["ece"])  # not reported for MC dropout (V.1)
            want.pop("ece")
        for name, value in want.items():
            np.testing.assert_allclose(row[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
        assert row["n_images"] == row["n_scored"] == 65 and row["dataset"] == "test"
        assert row["wall_time_s"] == float(ds.attrs["wall_time_s"]) > 0
        np.testing.assert_allclose(row["images_per_s"], 65 / float(ds.attrs["wall_time_s"]))
        net = n_params[row["model"].removesuffix("+mc_dropout")]
        assert row["param_count"] * 1e6 == pytest.approx(sum(q.numel() for q in
                                                             net.parameters()), abs=0.5)
    random_init = table.rows[table.column("model").index("test_byobnet")]
    timm_cfg = timm.create_model("test_byobnet").pretrained_cfg  # timm's own config
    assert random_init["img_size"] == timm_cfg["input_size"][-1] == 160
    assert random_init["crop_pct"] == timm_cfg["crop_pct"]
    assert random_init["interpolation"] == timm_cfg["interpolation"]
    trained = table.rows[table.column("model").index("test_byobnet@m0")]
    assert trained["img_size"] == 16  # the checkpoint's training size (its sidecar)


def test_rows_are_sorted_by_top1_descending(zoo):
    top1 = results_table([zoo], config=SelectiveConfig(mc_passes=PASSES)).column("top1")
    assert top1 == sorted(top1, reverse=True)
    synthetic = ResultsTable([{**dict.fromkeys(COLUMNS, math.nan), "model": m, "top1": t}
                              for m, t in (("b", 1.0), ("a", math.nan), ("c", 5.0),
                                           ("a2", 1.0))])
    from uqvision.results import _sorted

    assert [r["model"] for r in _sorted(synthetic.rows)] == ["c", "a2", "b", "a"]


def test_with_a_score_file_the_selective_numbers_are_the_score_files(zoo):
    default = score_selective([zoo], SelectiveConfig(calibration_size=0.3, mc_passes=PASSES))
    table = results_table([zoo], scores=default)  # none on the held-out images
    for row in table.rows:
        sel = default.sel(model=row["model"], calibration="none")
        assert all(_same(row[n], float(sel[n])) for n in ("auroc", "ece", "aurc"))
        assert row["n_scored"] == int(default.attrs["n_eval"]) < row["n_images"]
    assert table.format().splitlines()[0].endswith(
        f"over the score file's {int(default.attrs['n_eval'])} evaluation images")
    scores = score_selective([zoo], SelectiveConfig(calibration_size=0.3, mc_passes=PASSES,
                                                    none_samples="all"))
    table = results_table([zoo], scores=scores)
    assert table.source == "scores"
    assert sorted(table.column("model")) == sorted(scores["model"].values)
    caches = _caches(zoo)
    # without a score file the table computes them over every image: the same numbers as a
    # score file whose "none" row is scored on every image (Galil et al.'s official code)
    from_caches = results_table([zoo], config=SelectiveConfig(mc_passes=PASSES))
    for row in table.rows:
        sel = scores.sel(model=row["model"], calibration="none")
        for name in ("auroc", "ece", "aurc"):
            assert _same(row[name], float(sel[name])), name  # equal, not close
            other = from_caches.rows[from_caches.column("model").index(row["model"])]
            assert _same(row[name], other[name]), name
        assert row["n_scored"] == int(scores["n_scored"].sel(calibration="none")) == 65
        assert row["n_scored"] == row["n_images"] != int(scores.attrs["n_eval"])
        _, p, y = caches[row["model"]]
        want = _by_hand(p, y, _kappa(row["model"], p))  # top-1/5: every image, as timm
        np.testing.assert_allclose([row["top1"], row["top5"]], [want["top1"], want["top5"]],
                                   rtol=1e-12)
        np.testing.assert_allclose(row["auroc"], want["auroc"], rtol=1e-9)  # every image
        np.testing.assert_allclose(row["top1"], 100 * float(sel["accuracy"]), rtol=1e-12)


def test_a_cache_the_score_file_did_not_score_is_refused(tmp_path, write_cache):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 40)
    for m in ("a", "b"):
        write_cache(tmp_path, rng.normal(size=(40, 4)), y, model=m)
    scores = score_selective([tmp_path], SelectiveConfig(calibration_size=0.25,
                                                         none_samples="all"))
    table = results_table([tmp_path], scores=scores)
    # synthetic caches record no timing or preprocessing: those columns are unknown, and the
    # console table leaves them out
    assert all(math.isnan(v) for v in table.column("wall_time_s"))
    caption, header = table.format().splitlines()[:2]
    assert header.split() == ["model", "top1", "top5", "auroc", "ece", "aurc"]
    assert caption == ("dataset 'test', 40 images; top1/top5 in %; auroc/ece/aurc before "
                       "temperature scaling, over all images")
    # a score file without the n_scored coord (written before it) scored "none" on its
    # n_eval held-out images, and the table says so
    legacy = results_table([tmp_path], scores=scores.drop_vars(["n_scored", "sample_set"]))
    assert legacy.column("n_scored") == [30, 30]
    assert legacy.format().splitlines()[0] == (
        "dataset 'test', 40 images; top1/top5 in %; auroc/ece/aurc before temperature "
        "scaling, over the score file's 30 evaluation images")
    back = ResultsTable.read(table.write(tmp_path / "files")[1])  # unknown values round-trip
    assert all(_same(a[c], b[c]) for a, b in zip(back.rows, table.rows, strict=True)
               for c in COLUMNS)
    (tmp_path / "b.test.plain-000.nc").unlink()
    write_cache(tmp_path, rng.normal(size=(40, 4)), y, model="b")  # other logits, same name
    with pytest.raises(ValueError, match=r"b\.test\.plain-000\.nc' is not one the score file "
                                         "scored"):
        results_table([tmp_path], scores=scores)


def test_files_csv_json_round_trip_and_refuse_to_overwrite(zoo, tmp_path):
    table = results_table([zoo], config=SelectiveConfig(mc_passes=PASSES))
    csv_path, json_path = table.write(tmp_path / "out")
    assert (csv_path.name, json_path.name) == ("results.csv", "results.json")
    with open(csv_path, newline="") as f:
        header, *lines = list(csv.reader(f))
    assert tuple(header) == COLUMNS and set(TIMM_COLUMNS) <= set(header)
    for line, row in zip(lines, table.rows, strict=True):
        for name, text in zip(header, line, strict=True):
            value = row[name]
            if isinstance(value, float):  # full precision; unknown values empty
                assert (text == "") if math.isnan(value) else float(text) == value, name
            else:
                assert text == ("" if value is None else str(value)), name
    back = ResultsTable.read(json_path)
    assert back.source == table.source and len(back) == len(table)
    for a, b in zip(back.rows, table.rows, strict=True):
        assert all(_same(a[c], b[c]) for c in COLUMNS), (a, b)
    assert json.loads(json_path.read_text())["rows"][0]["model"] == table.rows[0]["model"]
    # refusal: nothing replaced, the error names the file; overwrite replaces both
    before = csv_path.read_bytes(), json_path.read_bytes()
    other = ResultsTable(table.rows[:1], table.source)
    with pytest.raises(FileExistsError) as err:
        other.write(tmp_path / "out")
    assert err.value.filename == str(csv_path)
    assert (csv_path.read_bytes(), json_path.read_bytes()) == before
    other.write(tmp_path / "out", overwrite=True)
    assert len(ResultsTable.read(json_path)) == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.csv",
                                                                    "results.json"]


def test_format_is_an_aligned_table(zoo):
    table = results_table([zoo], config=SelectiveConfig(mc_passes=PASSES))
    caption, header, *lines = table.format().splitlines()
    # what every row shares is said once, above the table
    assert caption == ("dataset 'test', 65 images; top1/top5 in %; auroc/ece/aurc before "
                       "temperature scaling, over all images")
    assert header.split() == [c for c in COLUMNS if c not in ("n_images", "n_scored",
                                                              "dataset")]
    assert len(lines) == len(table)
    for line, row in zip(lines, table.rows, strict=True):
        assert line.startswith(row["model"])
        assert f"{row['top1']:.2f}" in line and f"{row['images_per_s']:.1f}" in line
        # right-aligned numbers end where their header ends
        end = header.index("top1") + len("top1")
        assert line[:end].endswith(f"{row['top1']:.2f}")
    mc = next(ln for ln in lines if "+mc_dropout" in ln)
    assert " - " in mc  # no ECE for MC dropout


def test_score_command_prints_the_table_and_writes_it_beside(zoo, tmp_path, capsys):
    out = tmp_path / "sel.nc"
    args = ["score", "selective", "--caches", str(zoo), "--out", str(out),
            "--calibration-size", "0.3", "--mc-passes", str(PASSES)]
    assert main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    table = results_table([zoo], scores=read_dataset(out))
    assert printed[0] == str(out)
    assert printed[1:-2] == table.format().splitlines()
    assert printed[-2:] == [str(tmp_path / "sel.csv"), str(tmp_path / "sel.json")]
    back = ResultsTable.read(tmp_path / "sel.json")
    assert all(_same(a[c], b[c]) for a, b in zip(back.rows, table.rows, strict=True)
               for c in COLUMNS)
    # the table's files are refused like the score file, before any work
    out.unlink()
    assert main(args) == 2
    assert "sel.csv' already exists; pass --overwrite" in capsys.readouterr().err
    assert not out.exists()
    assert main([*args, "--overwrite"]) == 0


def test_predict_command_prints_accuracy_and_costs(spec, digits, tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["predict", "--model", spec, "--data", str(digits / "test"), "--out", str(out),
                 "--batch-size", "32"]) == 0
    printed = capsys.readouterr().out.splitlines()
    (path,) = out.glob("*.nc")
    ds = read_cache(path)
    assert printed[0] == str(path)
    # top-1/top-5 only: predict loads no selective scorer
    assert printed[1] == "dataset 'test', 65 images; top1/top5 in %, over all images"
    header, row = printed[2].split(), printed[3].split()
    assert header == ["model", "top1", "top5", "images_per_s", "wall_time_s", "param_count",
                      "img_size", "crop_pct", "interpolation"]
    z, y = ds["logits"].values.astype(np.float64), ds["label"].values
    order = np.argsort(-z, axis=1, kind="stable")  # by hand: rank of the label
    top1, top5 = (100 * np.mean((order[:, :k] == y[:, None]).any(axis=1)) for k in (1, 5))
    wall = float(ds.attrs["wall_time_s"])
    assert row == ["test_byobnet@m0", f"{top1:.2f}", f"{top5:.2f}", f"{65 / wall:.1f}",
                   f"{wall:.2f}", f"{int(ds.attrs['num_params']) / 1e6:.2f}", "16",
                   f"{json.loads(ds.attrs['data_config'])['crop_pct']:.3f}",
                   json.loads(ds.attrs["data_config"])["interpolation"]]
    assert printed[4].startswith("auroc/ece/aurc: uqvision score selective")
