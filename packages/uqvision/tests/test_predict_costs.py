"""The fixed costs of a prediction and how it runs: a command reads and hashes each checkpoint
once and scans its folder once; the DataLoader workers' default (:func:`uqvision.runtime.
loader_workers`) and that the logits do not depend on the worker count; ``channels_last`` and
``amp`` (docs/conventions.md#v-predict-speed): their effect on the logits, their place in the
cache identity, the CPU's refusal of fp16. Speed itself is measured in
benchmarks/bench_predict.py, not here."""

from __future__ import annotations

import collections
import importlib
import json
import multiprocessing
import os

import numpy as np
import pytest
import safetensors.torch
import timm
import torch
from uqmetrics import InputError, read_dataset, write_dataset

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.exceptions import CheckpointError
from uqvision.predict import AMP_MODES, PredictConfig, check_caches, predict, predict_to_files
from uqvision.runtime import MAX_LOADER_WORKERS, loader_workers

core = importlib.import_module("uqvision.models.weight_files")  # file_sha256 and its memo
data_module = importlib.import_module("uqvision.data.folders")  # ImageFolderDataset scans
# the modules of uqvision.predict that call them (``uqvision.predict.predict`` is the function)
plan_module = importlib.import_module("uqvision.predict.plan")  # _fingerprint: folder_fingerprint
files_module = importlib.import_module("uqvision.predict.files")  # check_caches: read_cache


# --------------------------------------------------------------------------------------------
# reads, hashes and scans per command


@pytest.fixture()
def plain_checkpoint(tmp_path):
    """A timm checkpoint uqvision did not train (no method in its sidecar): loaded by timm's
    pretrained-file overlay, the path on which the head check used to read the file whole."""
    torch.manual_seed(0)
    path = tmp_path / "plain.safetensors"
    net = timm.create_model("test_byobnet", num_classes=10)
    safetensors.torch.save_file(net.state_dict(), str(path))
    (tmp_path / "plain.json").write_text(json.dumps({"classes": [str(d) for d in range(10)]}))
    return path


@pytest.fixture()
def counted(monkeypatch):
    """Counts (without changing them) the hashes and loads of weight files, the scans and
    fingerprints of image folders and the cache reads of one process; forgets the hashes of
    earlier commands (each command is then as in a fresh process)."""
    counts: collections.Counter = collections.Counter()

    def counting(module, name, key, path_arg=True):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            counts[(key, os.path.realpath(args[0]) if path_arg else "")] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(core, "file_sha256", "hash")
    counting(safetensors.torch, "load_file", "load")
    counting(data_module, "scan_layout", "scan", path_arg=False)
    counting(plan_module, "folder_fingerprint", "fingerprint", path_arg=False)
    counting(files_module, "read_cache", "read_cache", path_arg=False)
    monkeypatch.setattr(core, "_SHA_MEMO", {})
    # the checkpoints were written moments ago: the memo's "racily clean" rule would re-hash
    # them (a file changed within 2 s of its hash is not remembered); here they do not change
    monkeypatch.setattr(core, "_RACY_S", -1.0)

    def of(key, path=""):
        return counts[(key, os.path.realpath(path) if path else "")]

    counts.of = of
    return counts


def _run(*args):
    assert main(["predict", *map(str, args)]) == 0


@pytest.mark.parametrize("which", ["trained", "plain"])
def test_a_command_reads_and_hashes_a_checkpoint_once_and_scans_its_folder_once(
        which, spec, plain_checkpoint, digits, tmp_path, counted):
    ckpt = spec.partition("=")[2] if which == "trained" else plain_checkpoint
    model = f"test_byobnet={ckpt}"
    out = tmp_path / "caches"
    command = ("--model", model, "--data", digits / "test", "--out", out, "--mode", "tta",
               "--passes", "2", "--tta-policy", "crop")
    _run(*command)  # fresh: nothing cached
    assert counted.of("hash", ckpt) == 1 and counted.of("load", ckpt) == 1
    assert counted.of("scan") == 1 and counted.of("fingerprint") == 1
    assert counted.of("read_cache") == 2  # each planned cache looked for once

    sorted(out.glob("*.nc"))[1].unlink()  # resume: one cache of two is missing
    counted.clear()
    core._SHA_MEMO.clear()
    _run(*command)
    assert counted.of("hash", ckpt) == 1 and counted.of("load", ckpt) == 1
    assert counted.of("scan") == 1 and counted.of("fingerprint") == 1
    assert counted.of("read_cache") == 2

    counted.clear()
    core._SHA_MEMO.clear()
    _run(*command)  # complete: the model is not even loaded
    assert counted.of("hash", ckpt) == 1 and counted.of("load", ckpt) == 0
    assert counted.of("scan") == 1 and counted.of("fingerprint") == 1


def test_a_checkpoint_that_does_not_load_is_still_named(digits, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")  # a header, not tensors
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        predict(f"test_byobnet={bad}", digits / "test", PredictConfig())


# --------------------------------------------------------------------------------------------
# DataLoader workers


def test_the_default_worker_count_follows_the_machine(monkeypatch):
    assert loader_workers(0, 100) == 0 and loader_workers(3, 1) == 3  # asked for: as asked
    assert loader_workers(None, 1) == 0 and loader_workers(None, 0) == 0  # nothing to overlap
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    for cores, gpu, cpu in ((1, 1, 0), (2, 1, 0), (3, 2, 1), (5, 4, 3), (64, 4, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        # a GPU run: every core but one decodes; a CPU run: the cores torch's threads leave
        assert loader_workers(None, 10, "cuda:0") == min(gpu, MAX_LOADER_WORKERS), cores
        assert loader_workers(None, 10, "cpu") == cpu, cores


def _workers_in_a_daemon(queue):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asked = loader_workers(2, 10, "cpu")
    queue.put((loader_workers(None, 10, "cuda"), asked, [str(w.message) for w in caught]))


def test_a_daemonic_process_starts_no_workers():
    """A multiprocessing.Pool worker (or a daemonic Dask worker) may not have children: a
    count asked for there gives 0 with a warning, not a failing cell."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_workers_in_a_daemon, args=(queue,), daemon=True)
    proc.start()
    default, asked, warned = queue.get(timeout=60)
    proc.join(60)
    assert default == 0 and asked == 0
    assert len(warned) == 1 and "2 DataLoader workers" in warned[0] and "daemonic" in warned[0]
    assert loader_workers(None, 10, "cuda") >= 1  # this process is not a daemon


@pytest.mark.parametrize("mode", ["plain", "tta", "mc_dropout"])
def test_logits_do_not_depend_on_the_worker_count(spec, digits, mode):
    """Bit for bit: the same batches (batch size fixed), whoever decodes them."""
    extra = {"passes": 3} if mode == "mc_dropout" else {"tta_policy": "crop"}
    runs = [predict(spec, digits / "test", PredictConfig(mode=mode, batch_size=16, seed=3,
                                                         num_workers=w, **extra))[0]
            for w in (0, 2)]
    assert np.array_equal(runs[0]["logits"].values, runs[1]["logits"].values)
    assert np.array_equal(runs[0]["label"].values, runs[1]["label"].values)


# --------------------------------------------------------------------------------------------
# channels_last and autocast


def test_channels_last_changes_the_logits_by_float_rounding_only(spec, digits, tmp_path):
    torch.manual_seed(0)
    resnet = tmp_path / "resnet.safetensors"
    safetensors.torch.save_file(timm.create_model("resnet10t", num_classes=10).state_dict(),
                                str(resnet))
    (tmp_path / "resnet.json").write_text(json.dumps({"classes": [str(d) for d in range(10)]}))
    for model in (spec, f"resnet10t={resnet}"):
        base, nhwc = (predict(model, digits / "test", PredictConfig(channels_last=cl))[0]
                      for cl in (False, True))
        z, z_cl = base["logits"].values, nhwc["logits"].values
        assert np.abs(z_cl - z).max() <= 1e-5 * max(1.0, np.abs(z).max()), model
        assert int(nhwc.attrs["channels_last"]) == 1 and int(base.attrs["channels_last"]) == 0
        assert json.loads(nhwc.attrs["config"])["channels_last"] is True


def test_channels_last_mc_dropout_keeps_the_backbone_once_and_its_logits(spec, digits):
    kw = {"mode": "mc_dropout", "passes": 3, "batch_size": 16}
    base, nhwc = (predict(spec, digits / "test", PredictConfig(**kw, channels_last=cl))[0]
                  for cl in (False, True))
    assert nhwc.attrs["mc_dropout_path"] == "features_once"
    z = base["logits"].values
    assert np.abs(nhwc["logits"].values - z).max() <= 1e-5 * max(1.0, np.abs(z).max())


def test_amp_modes_and_the_cpu_refusal_of_fp16(spec, digits, tmp_path, capsys):
    assert list(AMP_MODES) == ["off", "fp16", "bf16"]
    # the booleans of earlier versions: off, and autocast's dtype on the device
    assert PredictConfig(amp=False).amp == "off" and PredictConfig(amp=True).amp == "bf16"
    assert PredictConfig(amp=True, device="cuda").amp == "fp16"
    with pytest.raises(ValueError, match="amp='fp16' needs a CUDA device"):
        predict(spec, digits / "test", PredictConfig(amp="fp16"))
    with pytest.raises(ValueError, match="amp must be one of"):
        predict(spec, digits / "test", PredictConfig(amp="fp8"))
    assert main(["predict", "--model", spec, "--data", str(digits / "test"), "--out",
                 str(tmp_path / "c"), "--amp", "fp16"]) == 2
    assert "amp='fp16' needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    # bf16 on the CPU: the logits to bfloat16's 8 bits of mantissa
    base, bf16 = (predict(spec, digits / "test", PredictConfig(amp=a))[0]
                  for a in ("off", "bf16"))
    z = base["logits"].values
    assert bf16.attrs["amp"] == "bf16" and base.attrs["amp"] == "off"
    assert 0 < np.abs(bf16["logits"].values - z).max() <= 2 ** -6 * np.abs(z).max() * 4


def test_a_resume_with_another_memory_format_or_autocast_is_refused(spec, digits, tmp_path):
    # given off: the default (None) chooses NHWC for this conv net on the CPU, and takes a
    # cache of either format (tests/test_sweep_decode.py)
    predict_to_files(spec, digits / "test", tmp_path, PredictConfig(channels_last=False))
    for other, field in ((PredictConfig(channels_last=True), "channels_last"),
                         (PredictConfig(amp="bf16"), "amp")):
        with pytest.raises(InputError, match=f"{field} "):
            check_caches(spec, digits / "test", tmp_path, other)
    assert check_caches(spec, digits / "test", tmp_path, PredictConfig())[1] == set()


def test_a_cache_from_before_the_options_resumes_as_contiguous_without_autocast(
        spec, digits, tmp_path):
    (path,) = predict_to_files(spec, digits / "test", tmp_path, PredictConfig())
    old = read_dataset(path)
    config = json.loads(old.attrs["config"])
    config["amp"] = False  # as recorded before amp took a name
    del config["channels_last"]
    old.attrs["config"] = json.dumps(config)
    del old.attrs["amp"], old.attrs["channels_last"]
    moved = tmp_path / "old"
    moved.mkdir()
    write_dataset(old, moved / path.name)
    assert read_cache(moved / path.name).attrs.get("channels_last") is None
    assert check_caches(spec, digits / "test", moved, PredictConfig())[1] == set()
    with pytest.raises(InputError, match="channels_last"):
        check_caches(spec, digits / "test", moved, PredictConfig(channels_last=True))
