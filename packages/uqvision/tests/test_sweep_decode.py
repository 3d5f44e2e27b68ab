"""A sweep decodes each image once per preprocessing group (:mod:`uqvision.sweep.decode`):
counted decodes, caches bit-identical to separate ``predict`` runs, resume, a failed model
that loses nothing of the others; and the ``channels_last`` choice by architecture, recorded
in the caches, with the rule for caches made before it (contiguous)."""

from __future__ import annotations

import collections
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import timm
import torch

from uqvision.cache import read_cache
from uqvision.predict import PredictConfig, check_caches, predict, predict_to_files
from uqvision.predict.decoded import split_transform
from uqvision.sweep import sweep_predictions

#: Three models with one geometry (160 px, bicubic, crop 0.95; test_convnext with another mean
#: and std) and one of another (test_resnet: bilinear).
SHARED = ("test_byobnet", "test_efficientnet", "test_convnext")
OTHER = "test_resnet"


@pytest.fixture(scope="module")
def client():
    """An in-process Dask cluster: the cells run in this process, where decodes are counted."""
    from dask.distributed import Client, LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def decodes(monkeypatch):
    """Full decodes of image files, by image: the loader's decode functions wrapped (the
    folder's, used by predict, and the decoded module's, used by the sweep's shared decode)."""
    counts: collections.Counter = collections.Counter()

    def counted(fn):
        def wrapper(*args, **kwargs):
            counts[str(args[-1])] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in ("uqvision.data.folders", "uqvision.predict.decoded"):
        module = importlib.import_module(name)
        for fn in ("load_image", "_load_sample"):
            monkeypatch.setattr(module, fn, counted(getattr(module, fn)))
    return counts


def _logits(path: Path) -> np.ndarray:
    return read_cache(path)["logits"].values


def test_the_models_of_a_group_share_one_decode_and_their_logits_bit_for_bit(
        digits, tmp_path, client, decodes):
    data = digits / "test"
    n = sum(1 for _ in data.rglob("*.png"))
    keys = {m: split_transform(timm.data.create_transform(**timm.data.resolve_data_config(
        {}, model=timm.create_model(m, pretrained=False)))).key for m in (*SHARED, OTHER)}
    assert len({keys[m] for m in SHARED}) == 1 and keys[OTHER] != keys[SHARED[0]]
    cfg = PredictConfig(batch_size=16, allow_random_init=True)
    caches = tmp_path / "caches"
    report = sweep_predictions([*SHARED, OTHER], data, caches, cfg, client=client)
    assert report.failed == {} and len(report.computed) == 4
    # two groups: each image decoded once for the three models, once for test_resnet
    assert len(decodes) == n and set(decodes.values()) == {2}, collections.Counter(
        decodes.values())
    assert not (caches / ".decoded").exists()  # removed once every cell of its group is done
    decodes.clear()
    for m in (*SHARED, OTHER):
        (ds,) = predict(m, data, cfg)
        cached = read_cache(caches / f"{m}.test.plain-000.nc")
        assert np.array_equal(cached["logits"].values, ds["logits"].values), m
        assert np.array_equal(cached["label"].values, ds["label"].values), m
        assert cached.attrs.get("shared_decoding", "") == (keys[m] if m in SHARED else "")
        assert "shared_decoding" not in ds.attrs
    assert set(decodes.values()) == {4}  # separate runs: once per model (the counter counts)
    decodes.clear()
    # a rerun resumes: nothing computed, nothing decoded
    again = sweep_predictions([*SHARED, OTHER], data, caches, cfg, client=client)
    assert again.computed == [] and len(again.skipped) == 4 and not decodes


def test_without_shared_decoding_every_model_decodes(digits, tmp_path, client, decodes):
    cfg = PredictConfig(batch_size=32, allow_random_init=True)
    report = sweep_predictions(SHARED[:2], digits / "test", tmp_path, cfg, client=client,
                               share_decoding=False)
    assert report.failed == {} and set(decodes.values()) == {2}


def test_a_failed_model_loses_nothing_of_its_group_and_its_rerun_reads_the_kept_file(
        digits, tmp_path, client, decodes):
    data = digits / "test"
    broken = tmp_path / "w" / "test_efficientnet.safetensors"
    broken.parent.mkdir()
    broken.write_bytes(b"not a checkpoint at all")
    models = ["test_byobnet", "test_convnext", f"test_efficientnet={broken}"]
    cfg = PredictConfig(batch_size=32, allow_random_init=True)
    caches = tmp_path / "caches"
    stale = caches / ".decoded" / f".test.npy.{'0' * 32}.tmp"  # as a killed decode leaves it
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"partial")
    report = sweep_predictions(models, data, caches, cfg, client=client)
    assert not stale.exists()
    assert sorted(p.name for p in report.computed) == [
        "test_byobnet.test.plain-000.nc", "test_convnext.test.plain-000.nc"]
    assert list(report.failed) == ["test_efficientnet+test_efficientnet.test.plain-000"]
    (record,) = report.failed_models.values()
    assert record["kind"] == "failed" and record["model"] == "test_efficientnet@test_efficientnet"
    (kept,) = (caches / ".decoded").glob("*.npy")  # the group has a cell left: kept
    assert set(decodes.values()) == {1}
    decodes.clear()
    # the checkpoint repaired: the rerun computes that model alone, from the kept file
    assert _checkpoint("test_efficientnet", broken.parent) == models[2]
    again = sweep_predictions(models, data, caches, cfg, client=client)
    assert [p.name for p in again.computed] == [
        "test_efficientnet+test_efficientnet.test.plain-000.nc"]
    assert again.failed == {} and not decodes and not kept.exists()
    cached = read_cache(again.computed[0])
    (ds,) = predict(models[2], data, cfg)
    assert np.array_equal(cached["logits"].values, ds["logits"].values)
    assert cached.attrs["shared_decoding"]


def test_a_batch_of_decoded_rows_equals_each_image_through_its_transform(digits, tmp_path):
    """The batched tail (ToTensor + Normalize on a whole batch of 8-bit rows) gives the tensors
    of the model's own transform of each image bit for bit, for ImageNet's mean and std and
    for 0.5; and a transform that does not split reads the image files."""
    from uqvision.data import DataConfig, ImageFolderDataset, eval_transform
    from uqvision.predict.decoded import decode_images, decoded_folder
    from uqvision.predict.plan import _fingerprint

    folder = ImageFolderDataset(digits / "test")
    ids = list(range(0, len(folder), 3))
    for mean, std in (((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5,) * 3, (0.5,) * 3)):
        transform = eval_transform(DataConfig((3, 48, 48), mean, std, crop_pct=0.9,
                                              interpolation="bicubic"))
        split = split_transform(transform)
        path = tmp_path / f"{mean[0]}.npy"
        decoded = decode_images(folder, split, path, _fingerprint(folder), threads=2)
        assert decoded.shape == (len(folder), 48, 48, 3)
        view = decoded_folder(folder, decoded, _fingerprint(folder))
        ds = view.with_transform(transform)
        rows, ys, got = ds.collate(ds.__getitems__(ids))
        batch = ds.to_device(rows, got.tolist(), "cpu")
        own = folder.with_transform(transform)
        assert batch.is_contiguous() and got.tolist() == ids
        for x, y, k in zip(batch, ys.tolist(), ids, strict=True):
            x_own, y_own, _ = own[k]
            assert y == y_own and torch.equal(x, x_own)
    assert type(view.with_transform(None)).__name__ == "ImageFolderDataset"
    # timm's non-square resize (ResizeKeepRatio) is not a step the key knows: no split
    assert split_transform(eval_transform(DataConfig((3, 48, 40), mean, std))) is None
    assert decoded_folder(folder, decoded, "another fingerprint") is folder


def test_a_group_s_pixels_are_held_on_the_device_once_for_all_its_models(
        digits, tmp_path, monkeypatch):
    """The pixels of a decoded file are loaded on the device once per process for every model
    of the group (held as on CUDA, here on the CPU), and each model's batches made from them
    equal its own transform's bit for bit; a rewritten file is loaded again, a removed one let
    go, and a file that does not fit is read a batch at a time, to the same numbers."""
    from uqvision.data import DataConfig, ImageFolderDataset, eval_transform
    from uqvision.predict import decoded as dec
    from uqvision.predict.plan import _fingerprint

    monkeypatch.setattr(dec, "_keep_resident", lambda device: True)
    monkeypatch.setattr(dec, "_RESIDENT", collections.OrderedDict())
    uploads = []
    real = dec.DecodedImages.rows
    monkeypatch.setattr(dec.DecodedImages, "rows", lambda self: uploads.append(1) or real(self))
    folder = ImageFolderDataset(digits / "test")
    ids = list(range(1, len(folder), 2))
    stats = (((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5,) * 3, (0.5,) * 3))
    transforms = [eval_transform(DataConfig((3, 48, 48), m, s, crop_pct=0.9,
                                            interpolation="bicubic")) for m, s in stats]
    path = tmp_path / "group.npy"
    decoded = dec.decode_images(folder, split_transform(transforms[0]), path,
                                _fingerprint(folder), threads=2)
    view = dec.decoded_folder(folder, decoded, _fingerprint(folder))

    def check() -> None:
        for transform in transforms:  # two models of one group: their own mean and std
            ds = view.with_transform(transform)
            rows, _, got = ds.collate(ds.__getitems__(ids))
            batch = ds.to_device(rows, got.tolist(), "cpu")
            own = folder.with_transform(transform)
            assert all(torch.equal(x, own[k][0]) for x, k in zip(batch, ids, strict=True))

    uploads.clear()
    check()
    assert len(uploads) == 1 and len(dec._RESIDENT) == 1  # once for both models
    check()
    assert len(uploads) == 1
    st = os.stat(path)  # rewritten (a later modification time): loaded again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    check()
    assert len(uploads) == 2 and len(dec._RESIDENT) == 1
    monkeypatch.setattr(dec, "RESIDENT_FRACTION", 0.0)  # does not fit: a batch at a time
    other = dec.decode_images(folder, split_transform(transforms[0]), tmp_path / "b.npy",
                              _fingerprint(folder), threads=1)
    assert dec._resident(other, torch.device("cpu")) is None
    assert len(dec._RESIDENT) == 0  # the held file let go to make room, in vain
    view = dec.decoded_folder(folder, other, _fingerprint(folder))
    check()
    monkeypatch.setattr(dec, "RESIDENT_FRACTION", 0.5)
    assert dec._resident(other, torch.device("cpu")) is not None
    (tmp_path / "b.npy").unlink()
    assert dec._resident(decoded, torch.device("cpu")) is not None
    assert list(dec._RESIDENT) == [(str(path.resolve()), "cpu")]  # the removed file let go


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_group_s_batches_are_made_on_the_device_to_the_cpu_s_numbers(digits, tmp_path):
    """On CUDA the file's pixels are held on the device and each batch is made there: the
    same numbers as on the CPU (to float, / 255, - mean, / std: correctly rounded in both)."""
    from uqvision.data import DataConfig, ImageFolderDataset, eval_transform
    from uqvision.predict import decoded as dec
    from uqvision.predict.plan import _fingerprint

    folder = ImageFolderDataset(digits / "test")
    transform = eval_transform(DataConfig((3, 48, 48), (0.485, 0.456, 0.406),
                                          (0.229, 0.224, 0.225), crop_pct=0.9))
    decoded = dec.decode_images(folder, split_transform(transform), tmp_path / "g.npy",
                                _fingerprint(folder), threads=2)
    ds = dec.decoded_folder(folder, decoded, _fingerprint(folder)).with_transform(transform)
    rows, _, got = ds.collate(ds.__getitems__(list(range(len(folder)))))
    on_gpu = ds.to_device(rows, got.tolist(), "cuda")
    assert dec._resident(decoded, torch.device("cuda")).is_cuda
    assert torch.equal(on_gpu.cpu(), ds.to_device(rows, got.tolist(), "cpu"))
    dec.release_decoded()


def _checkpoint(arch: str, where: Path, **model_kwargs) -> str:
    """``arch=FILE``: random weights (seed 0) of a 10-class ``arch`` with a sidecar."""
    torch.manual_seed(0)
    net = timm.create_model(arch, num_classes=10, **model_kwargs)
    path = where / f"{arch}.safetensors"
    safetensors.torch.save_file(net.state_dict(), str(path))
    path.with_suffix(".json").write_text(json.dumps({
        "classes": [str(d) for d in range(10)], "model_kwargs": model_kwargs}))
    return f"{arch}={path}"


def test_a_sweep_cell_s_network_is_built_once_per_process_for_its_model(
        digits, tmp_path, monkeypatch):
    """``keep_model`` (a sweep's cells): the network is built once per process for the cells
    of one model (two folders here), to the logits of a fresh build bit for bit; another
    memory format or a rewritten checkpoint builds it again; a plain call keeps nothing."""
    import dataclasses

    from uqvision.predict import core
    from uqvision.sweep.run import predict_cell

    builds = []
    real = core.load_run
    monkeypatch.setattr(core, "load_run", lambda *a, **k: builds.append(1) or real(*a, **k))
    monkeypatch.setattr(core, "_KEPT", [])
    spec = _checkpoint("test_byobnet", tmp_path)
    cfg = PredictConfig(batch_size=16, num_workers=0, channels_last=False)
    fresh = [predict(spec, digits / d, cfg)[0] for d in ("test", "train")]
    assert len(builds) == 2 and core._KEPT == []
    cells = [predict_cell(*spec.split("=")[:1], spec.split("=")[1], None, str(digits / d), d,
                          dataclasses.asdict(cfg)) for d in ("test", "train")]
    assert len(builds) == 3  # one build for both cells
    for ds, cell in zip(fresh, cells, strict=True):
        assert np.array_equal(ds["logits"].values, cell["logits"].values)
    predict(spec, digits / "test", dataclasses.replace(cfg, channels_last=True),
            keep_model=True)
    assert len(builds) == 4  # another memory format: built again (and kept instead)
    ckpt = Path(spec.split("=")[1])
    st = os.stat(ckpt)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    predict(spec, digits / "test", dataclasses.replace(cfg, channels_last=True),
            keep_model=True)
    assert len(builds) == 5  # the checkpoint rewritten: built again
    core.release_model()
    assert core._KEPT == []


def test_mc_dropout_cells_share_the_decode_too(digits, tmp_path, client, decodes):
    data = digits / "test"
    cfg = PredictConfig(mode="mc_dropout", passes=3, batch_size=32)
    models = [_checkpoint(a, tmp_path, drop_rate=0.2)
              for a in ("test_byobnet", "test_convnext")]
    report = sweep_predictions(models, data, tmp_path / "caches", cfg, client=client)
    assert report.failed == {} and set(decodes.values()) == {1}
    for m, path in zip(models, report.computed, strict=True):
        (ds,) = predict(m, data, cfg)
        assert np.array_equal(_logits(path), ds["logits"].values)


# --------------------------------------------------------------------------------------------
# channels_last by architecture


def test_channels_last_is_chosen_by_architecture_and_recorded(digits):
    data = digits / "test"
    cfg = {"batch_size": 32, "allow_random_init": True}
    conv = predict("test_byobnet", data, PredictConfig(**cfg))[0]
    vit = predict("test_vit", data, PredictConfig(**cfg))[0]
    given = predict("test_byobnet", data, PredictConfig(**cfg, channels_last=False))[0]
    for ds, on, source in ((conv, 1, "auto"), (vit, 0, "auto"), (given, 0, "given")):
        assert int(ds.attrs["channels_last"]) == on and ds.attrs["channels_last_source"] == source
        assert json.loads(ds.attrs["config"])["channels_last"] is bool(on)
    # NHWC changes a conv net's logits by float rounding, not bit for bit
    z, z_cl = given["logits"].values, conv["logits"].values
    assert np.abs(z_cl - z).max() <= 1e-5 * max(1.0, np.abs(z).max())


def _as_before_the_option(path: Path) -> None:
    """Rewrite a cache as one written before ``channels_last`` was recorded."""
    from uqmetrics import write_dataset
    from uqmetrics.runs.io import read_dataset

    old = read_dataset(path)
    config = json.loads(old.attrs["config"])
    del config["channels_last"]
    old.attrs["config"] = json.dumps(config)
    del old.attrs["channels_last"], old.attrs["channels_last_source"]
    write_dataset(old, path, overwrite=True)


def test_a_cache_from_before_the_choice_is_contiguous_and_its_model_resumes_so(
        digits, tmp_path, client):
    """A model whose caches there predate the option resumes contiguous (what they were),
    through predict_to_files and through a sweep: one model's caches never mix formats."""
    data = digits / "test"
    cfg = {"mode": "tta", "batch_size": 32, "allow_random_init": True}
    for sweep in (False, True):
        out = tmp_path / f"sweep{int(sweep)}"
        (first,) = predict_to_files("test_byobnet", data, out, PredictConfig(
            **cfg, passes=1, channels_last=False))
        _as_before_the_option(first)
        assert check_caches("test_byobnet", data, out, PredictConfig(**cfg, passes=1))[1] == set()
        if sweep:
            report = sweep_predictions(["test_byobnet"], data, out,
                                       PredictConfig(**cfg, passes=2), client=client)
            assert [p.name for p in report.skipped] == [first.name]
            (second,) = report.computed
        else:
            second = predict_to_files("test_byobnet", data, out, PredictConfig(**cfg, passes=2))[1]
        ds = read_cache(second)
        assert int(ds.attrs["channels_last"]) == 0 and ds.attrs["channels_last_source"] == "given"
    # with no cache there, the default chooses NHWC for this conv net
    fresh = predict_to_files("test_byobnet", data, tmp_path / "fresh", PredictConfig(**cfg))
    assert int(read_cache(fresh[0]).attrs["channels_last"]) == 1


def test_a_resumed_models_new_caches_record_how_its_format_was_chosen_as_its_first(
        digits, tmp_path, client):
    """A model resumed with the default (format by architecture) computes its missing caches
    pinned to its caches' format, and records their ``channels_last_source`` (``auto``), as
    an uninterrupted run records it: a cache's attrs never depend on where a run was cut. It
    recorded ``given`` (pinned by the resume), through predict_to_files and a sweep."""
    data = digits / "test"
    cfg = {"mode": "tta", "batch_size": 32, "allow_random_init": True}
    for sweep in (False, True):
        out = tmp_path / f"sweep{int(sweep)}"
        (first,) = predict_to_files("test_byobnet", data, out, PredictConfig(**cfg, passes=1))
        if sweep:
            report = sweep_predictions(["test_byobnet"], data, out,
                                       PredictConfig(**cfg, passes=2), client=client)
            (second,) = report.computed
        else:
            second = predict_to_files("test_byobnet", data, out, PredictConfig(**cfg, passes=2))[1]
        for path in (first, second):
            ds = read_cache(path)
            assert (int(ds.attrs["channels_last"]), ds.attrs["channels_last_source"]) == (1, "auto")
