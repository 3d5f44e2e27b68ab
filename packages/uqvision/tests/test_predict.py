import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from uqvision.cache import read_cache
from uqvision.predict import PredictConfig, predict, predict_to_files
from uqvision.runtime import shard_indices


@given(n=st.integers(0, 200), world=st.integers(1, 9))
def test_shards_cover_every_sample_exactly_once(n, world):
    shards = [shard_indices(n, world, r) for r in range(world)]
    assert np.array_equal(np.concatenate(shards), np.arange(n))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_plain_cache_contract(spec, digits, tmp_path, rounding_tol):
    (path,) = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(batch_size=16))
    ds = read_cache(path)
    assert ds["logits"].dims == ("sample", "class") and ds["logits"].shape == (65, 10)
    assert ds["label"].dims == ("sample",)
    assert list(ds["class"].values) == [str(d) for d in range(10)]
    for key in ("model", "architecture", "tag", "checkpoint_sha256", "data_config",
                "dataset_fingerprint", "mode", "pass_index", "git_commit", "torch_version"):
        assert key in ds.attrs, key
    assert ds.attrs["mode"] == "plain" and ds.attrs["architecture"] == "test_byobnet"
    # batch size does not change the result beyond the float32 rounding of batched kernels
    (other,) = predict(spec, digits / "test", PredictConfig(batch_size=7))
    np.testing.assert_allclose(other["logits"].values, ds["logits"].values,
                               **rounding_tol(spec, ds["logits"].values))
    # resume: a complete file is not recomputed
    mtime = path.stat().st_mtime_ns
    predict_to_files(spec, digits / "test", tmp_path, PredictConfig(batch_size=16))
    assert path.stat().st_mtime_ns == mtime


def test_tta_passes_differ_and_are_reproducible_by_seed(spec, digits, rounding_tol):
    cfg = {"mode": "tta", "tta_policy": "crop"}
    p01 = predict(spec, digits / "test", PredictConfig(**cfg, passes=2, seed=5, batch_size=16))
    p1 = predict(spec, digits / "test", PredictConfig(**cfg, first_pass=1, passes=1, seed=5,
                                                      batch_size=9))[0]
    other_seed = predict(spec, digits / "test", PredictConfig(**cfg, first_pass=1, passes=1,
                                                              seed=6))[0]
    z0, z1 = p01[0]["logits"].values, p01[1]["logits"].values
    assert [d.attrs["pass_index"] for d in p01] == [0, 1]
    assert np.abs(z0 - z1).max() > 1e-3  # different augmentations
    # same seed and pass, batch 9 against 16: to float32 rounding
    np.testing.assert_allclose(p1["logits"].values, z1, **rounding_tol(spec, z1))
    assert np.abs(other_seed["logits"].values - z1).max() > 1e-3


# Batched kernels round differently at different batch sizes, process counts and CPUs, so
# caches computed at different batch sizes are compared to float32 rounding, the tolerance
# ``rounding_tol`` derives from the network's sums (conftest._rounding_tol: 4 sqrt(N) eps
# max|z|; about 1e-6 for the digits model's logits, whose batch 16 vs 7 difference measured
# 1.5e-8 under ATen's default/AVX2/AVX-512 kernels, MKL limited to AVX2 and MKL CNR: test_byobnet
# has products small enough for the BLAS to pick its kernel by the batch's shape and the thread
# count, docs/conventions.md#v-predict-speed). The defect this guards against (masks drawn per
# batch from the global RNG) moved MC logits by 0.05-0.09.


@pytest.mark.parametrize("mode", ["plain", "tta"])
def test_no_forward_pass_computes_a_lone_image(spec, digits, mode):
    """65 images at batch 16 leave a last batch of one image, which the BLAS would compute as a
    matrix-vector product (another order of summation: its logits would depend on the batch
    size, 6e-8 for resnet18 on the CPU): it is computed as two copies, the first kept."""
    rows: list[int] = []

    def record(module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].ndim == 4:
            rows.append(args[0].shape[0])

    handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        (pred, *_) = predict(spec, digits / "test", PredictConfig(
            mode=mode, passes=2, tta_policy="crop", batch_size=16, seed=4))
    finally:
        handle.remove()
    assert pred["logits"].shape[-2] == 65  # every image once, the copy dropped
    assert rows and min(rows) == 2 and max(rows) == 16


@pytest.mark.parametrize("mode", ["mc_dropout", "tta"])
def test_stochastic_passes_do_not_depend_on_batching(spec, digits, mode, rounding_tol):
    cfg = {"mode": mode, "passes": 3, "seed": 2, "tta_policy": "crop"}
    a = predict(spec, digits / "test", PredictConfig(**cfg, batch_size=16))
    b = predict(spec, digits / "test", PredictConfig(**cfg, batch_size=7))
    assert len(a) == len(b) == (1 if mode == "mc_dropout" else 3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x["logits"].values, y["logits"].values,
                                   **rounding_tol(spec, y["logits"].values))


@pytest.mark.parametrize("mode", ["plain", "tta", "mc_dropout"])
def test_predict_never_touches_the_global_rng(spec, digits, mode):
    torch.manual_seed(11)
    state = torch.get_rng_state()
    (first, *_) = predict(spec, digits / "test", PredictConfig(mode=mode, passes=2,
                                                               tta_policy="crop"))
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(12)  # another caller state: the same cache
    (again, *_) = predict(spec, digits / "test", PredictConfig(mode=mode, passes=2,
                                                               tta_policy="crop"))
    np.testing.assert_array_equal(first["logits"].values, again["logits"].values)


def test_mc_dropout_cache_has_passes(spec, digits):
    (ds,) = predict(spec, digits / "test", PredictConfig(mode="mc_dropout", passes=3,
                                                         batch_size=32))
    z = ds["logits"].values
    assert ds["logits"].dims == ("pass", "sample", "class") and z.shape == (3, 65, 10)
    assert np.abs(z[0] - z[1]).max() > 1e-4
    (again,) = predict(spec, digits / "test", PredictConfig(mode="mc_dropout", passes=3,
                                                            batch_size=32))
    np.testing.assert_array_equal(again["logits"].values, z)  # seeded masks


def test_embeddings_are_cached(spec, digits, rounding_tol):
    (ds,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=32))
    (plain,) = predict(spec, digits / "test", PredictConfig(batch_size=32))
    assert ds["embedding"].dims == ("sample", "feature") and ds.sizes["sample"] == 65
    # forward_features -> forward_head(pre_logits) -> classifier: the network's own forward
    np.testing.assert_allclose(ds["logits"].values, plain["logits"].values,
                               **rounding_tol(spec, plain["logits"].values))


def test_mc_dropout_refused_without_dropout(digits, tmp_path):
    import timm
    import torch

    path = tmp_path / "r.pth"
    torch.save(timm.create_model("test_resnet", num_classes=10).state_dict(), path)
    with pytest.raises(ValueError, match="no dropout module"):
        predict(f"test_resnet={path}", digits / "test", PredictConfig(mode="mc_dropout"))


def test_bad_inputs_fail_before_running(spec, digits, tmp_path):
    with pytest.raises(FileNotFoundError):
        predict(spec, tmp_path / "nope", PredictConfig())
    three = tmp_path / "three"
    for c in "abc":
        (three / c).mkdir(parents=True)
        (three / c / "x.png").write_bytes((digits / "test" / "0" / next(
            p.name for p in (digits / "test" / "0").iterdir())).read_bytes())
    with pytest.raises(ValueError, match=r"has 3 class\(es\) that model 'test_byobnet@m0' "
                                         r"does not have: \['a', 'b', 'c'\]"):  # by name
        predict(spec, three, PredictConfig())
    with pytest.raises(ValueError, match="unknown prediction mode 'swag'; valid prediction "
                                         "modes: plain, tta, mc_dropout"):
        predict(spec, digits / "test", PredictConfig(mode="swag"))
    with pytest.raises(ValueError, match="did you mean"):
        predict("test_byobnett", digits / "test", PredictConfig())


def test_a_pretrained_tag_drives_the_full_resolution_path(tmp_path):
    from uqvision.data import make_synthetic_folder

    root = make_synthetic_folder(tmp_path / "fake", n_classes=3, n_per_class=2, image_size=200)
    # the preprocessing comes from the tag's pretrained config (160 px, crop_pct 0.95)
    (ds,) = predict("test_resnet.r160_in1k", root / "test",
                    PredictConfig(allow_random_init=True, batch_size=4))
    assert ds["logits"].shape == (6, 3)
    cfg = json.loads(ds.attrs["data_config"])
    assert cfg["input_size"] == [3, 160, 160] and cfg["crop_pct"] == 0.95
    assert ds.attrs["tag"] == "r160_in1k+random_init" and ds.attrs["checkpoint_sha256"] == ""


# -- every training method's samples into caches (issue 10, item 3) -----------------------
def _train_run(digits, out, method, seed=0, arch="test_byobnet", **hparams):
    from uqvision.training.loop import ImageTrainConfig, train_model

    hp = {"batch_size": 16, **{k: str(v) for k, v in hparams.items()}}
    return train_model(digits / "train", out, ImageTrainConfig(
        arch=arch, method=method, input_size=16, seed=seed, hparams=hp,
        drop_rate=0.2 if arch == "test_byobnet" else 0.0)).checkpoint


@pytest.fixture(scope="module")
def runs(digits, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    return {
        "sse": _train_run(digits, d / "sse", "sse", cycles=2, cycle_epochs=1),
        "vi": _train_run(digits, d / "vi", "vi", arch="test_vit", pretrain_epochs=1, epochs=1),
        "mc_dropout": _train_run(digits, d / "mc", "mc_dropout", epochs=1),
    }


def test_a_run_gives_one_cache_per_sample_and_pass_and_resumes(runs, digits, tmp_path):
    spec = f"test_byobnet={runs['sse']}"
    cfg = {"tta_policy": "crop", "batch_size": 32}
    plain = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(**cfg))
    tta = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(mode="tta", passes=2,
                                                                           **cfg))
    assert len(plain) == 2 and len(tta) == 4  # 2 snapshots x (1 plain, 2 augmentations)
    caches = [read_cache(p) for p in plain + tta]
    assert {c.attrs["method"] for c in caches} == {"sse"}
    assert {c.attrs["run"] for c in caches} == {"test_byobnet@sse"}
    assert [c.attrs["sample_index"] for c in caches] == [0, 1, 0, 0, 1, 1]
    assert [c.attrs["pass_index"] for c in caches] == [0, 0, 0, 1, 0, 1]
    assert caches[0].attrs["model"] == "test_byobnet@sse:000"
    assert np.abs(caches[0]["logits"].values - caches[1]["logits"].values).max() > 1e-4
    # augmentation draws differ between samples and between passes
    z = [c["logits"].values for c in caches[2:]]
    assert min(np.abs(a - b).max() for i, a in enumerate(z) for b in z[i + 1:]) > 1e-4
    # resume: only the missing cache is computed, the others are kept as they are
    mtimes = {p: p.stat().st_mtime_ns for p in tta}
    tta[3].unlink()
    again = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(mode="tta",
                                                                            passes=2, **cfg))
    assert again == tta and all(p.stat().st_mtime_ns == mtimes[p] for p in tta[:3])
    np.testing.assert_array_equal(read_cache(tta[3])["logits"].values, z[3])


@pytest.mark.parametrize("method", ["vi", "mc_dropout"])
def test_stochastic_passes_of_a_method_do_not_depend_on_batching(runs, digits, method,
                                                                 rounding_tol):
    """Each pass is a sample; its noise (VI's local reparameterisation, dropout masks) is drawn
    per image from (seed, pass, image id): the same caches at any batch size (to float32
    rounding), and the global RNG untouched. Drawn from the global RNG per batch, the two
    differed by O(1)."""
    arch = "test_vit" if method == "vi" else "test_byobnet"
    spec = f"{arch}={runs[method]}"
    torch.manual_seed(11)
    state = torch.get_rng_state()
    a = predict(spec, digits / "test", PredictConfig(samples=2, batch_size=16, seed=4))
    assert torch.equal(torch.get_rng_state(), state)
    b = predict(spec, digits / "test", PredictConfig(samples=2, batch_size=7, seed=4))
    assert [d.attrs["sample_index"] for d in a] == [0, 1]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x["logits"].values, y["logits"].values,
                                   **rounding_tol(spec, y["logits"].values))
    assert np.abs(a[0]["logits"].values - a[1]["logits"].values).max() > 1e-3


def test_training_a_method_twice_with_one_seed_gives_the_same_caches(digits, tmp_path):
    """Issue 10, item 6, through the whole chain: SWAG (posterior draws, BatchNorm updates)."""
    hp = {"pretrain_epochs": 1, "swag_epochs": 1, "collect_epochs": 0.25, "rank": 3}
    caches = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        ckpt = _train_run(digits, tmp_path / name, "swag", seed=seed, **hp)
        caches.append([c["logits"].values for c in predict(
            f"test_byobnet={ckpt}", digits / "test", PredictConfig(samples=2, mode="tta",
                                                                  tta_policy="crop"))])
    for x, y in zip(caches[0], caches[1], strict=True):
        np.testing.assert_array_equal(x, y)
    assert all(np.abs(x - y).max() > 1e-3 for x, y in zip(caches[0], caches[2], strict=True))


# -- URL runs: (logits, u, embedding) through the one predict path (issue 12) --------------
URL_METHODS = ("losspred", "mcdropout", "hetxl", "nivmf")  # one deterministic, three noisy heads


@pytest.fixture(scope="module")
def url_runs(digits, tmp_path_factory):
    d = tmp_path_factory.mktemp("url_runs")
    return {m: f"test_resnet={_train_run(digits, d / m, m, arch='test_resnet', epochs=1)}"
            for m in URL_METHODS}


def _direct_forward(spec, root, *, mode, seed, batch_size, ids=True):
    """The network run by hand over the folder, batch by batch (the removed
    ``transfer.extract`` loop), a lone image as two copies as predict computes it
    (``uqvision.predict.loop.MIN_ROWS``): logits, u, embedding."""
    from torch.utils.data import DataLoader

    from uqvision.data import ImageFolderDataset, flush_denormal
    from uqvision.protocols.url.crop import crop_transform
    from uqvision.training.runs import load_run

    net = load_run(spec).loaded
    folder = (ImageFolderDataset(root, crop_transform(net.transform), augment_seed=seed)
              if mode == "crop" else ImageFolderDataset(root, net.transform))
    out = []
    with flush_denormal():
        for x, _, i in DataLoader(folder, batch_size=batch_size):
            n, copies = len(x), 2 if len(x) == 1 else 1
            out.append([t[:n].numpy() for t in net.model.predict(
                torch.cat([x] * copies), i.tolist() * copies if ids else None, seed)])
    return [np.concatenate(a) for a in zip(*out, strict=True)]


@pytest.mark.parametrize("mode", ["plain", "crop"])
@pytest.mark.parametrize("method", URL_METHODS)
def test_url_caches_equal_a_direct_forward_of_the_network(url_runs, digits, method, mode):
    """predict asks a URLModel for (logits, u, embedding): the cache holds exactly what the
    network gives for the same images (bit for bit at the same batch size; the crop mode's
    images and fractions from the cache's sample seed). The deterministic head equals the old
    path's forward without sample ids."""
    spec = url_runs[method]
    (ds,) = predict(spec, digits / "test", PredictConfig(mode=mode, embeddings=True,
                                                         batch_size=16, seed=4))
    assert ds.attrs["method"] == method and ds.attrs["model"] == spec.split("=")[0] + "@" + method
    assert ds["uncertainty"].dims == ("sample",) and ds["embedding"].dims == ("sample", "feature")
    z, u, e = _direct_forward(spec, digits / "test", mode=mode, seed=ds.attrs["sample_seed"],
                              batch_size=16, ids=method != "losspred")
    np.testing.assert_array_equal(ds["logits"].values, z)
    np.testing.assert_array_equal(ds["uncertainty"].values, u)
    np.testing.assert_array_equal(ds["embedding"].values, e)
    if mode == "crop":
        from uqvision.protocols.url.crop import crop_fractions

        np.testing.assert_allclose(ds["crop_fraction"].values, crop_fractions(
            ds.attrs["sample_seed"], range(ds.sizes["sample"])), rtol=1e-6)


@pytest.mark.parametrize("method", URL_METHODS[1:])
def test_url_noisy_heads_do_not_depend_on_batching(url_runs, digits, method, rounding_tol):
    """MC dropout, HET-XL and nivMF draw their noise per image from (seed, image id): batch 7,
    batch 16 and one image at a time give the same u and logits (to the float32 rounding of
    batched kernels, ``rounding_tol``: one image at a time even takes another convolution
    backend), the global RNG is untouched, and another seed draws other noise (other logits;
    nivMF's u = 1/kappa has none)."""
    spec = url_runs[method]
    torch.manual_seed(11)
    state = torch.get_rng_state()
    (a,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=16, seed=4))
    assert torch.equal(torch.get_rng_state(), state)
    (b,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=7, seed=4))
    z1, u1, _ = _direct_forward(spec, digits / "test", mode="plain",
                                seed=a.attrs["sample_seed"], batch_size=1)
    for v, one in (("logits", z1), ("uncertainty", u1)):
        tol = rounding_tol(spec, one)
        np.testing.assert_allclose(a[v].values, b[v].values, **tol)
        np.testing.assert_allclose(a[v].values, one, **tol)
    (c,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=16, seed=5))
    assert np.abs(c["logits"].values - a["logits"].values).max() > 1e-6


def test_zero_shot_caches_have_no_logits(url_runs, tmp_path):
    """logits=False: a folder of other classes (3, the model has 10) gives embeddings and u."""
    from uqvision.data import make_synthetic_folder

    root = make_synthetic_folder(tmp_path / "other", n_classes=3, n_per_class=3,
                                 image_size=16) / "test"
    (ds,) = predict(url_runs["losspred"], root, PredictConfig(embeddings=True, logits=False))
    assert "logits" not in ds and ds.sizes["sample"] == 9 and ds.sizes["class"] == 3
    assert np.isfinite(ds["uncertainty"].values).all() and ds["embedding"].shape[0] == 9
    with pytest.raises(ValueError, match=r"has 3 class\(es\) that model .* does not have: "
                                         r"\['class_000', 'class_001', 'class_002'\]"):
        predict(url_runs["losspred"], root, PredictConfig(embeddings=True))
    with pytest.raises(ValueError, match="logits=False needs embeddings=True"):
        PredictConfig(logits=False)


@pytest.mark.slow
def test_url_torchrun_two_processes_equal_one_process(url_runs, digits, tmp_path, rounding_tol):
    """A URL run's noisy head (MC dropout) under 2 gloo processes (uneven shards): the same
    logits, u and embeddings as one process (to float32 rounding: other shards, other
    batches)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = url_runs["mcdropout"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "uqvision",
           "--threads", "1", "predict", "--model", spec, "--data", str(digits / "test"),
           "--out", str(tmp_path), "--batch-size", "8", "--seed", "3", "--embeddings"]
    r = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = sorted(tmp_path.glob("*.nc"))
    dist = read_cache(path)
    (one,) = predict(spec, digits / "test", PredictConfig(embeddings=True, batch_size=8, seed=3))
    assert dist.attrs["world_size"] == 2
    for v in ("logits", "uncertainty", "embedding"):
        np.testing.assert_allclose(dist[v].values, one[v].values,
                                   **rounding_tol(spec, one[v].values))


def _full_passes(spec, folder, cfg, seed):
    """MC-dropout logits (pass, sample, class) of the whole network once per pass, masks seeded
    by ``seed`` (a cache's ``sample_seed``): the reference the backbone-reusing path must equal
    bit for bit."""
    import dataclasses

    from uqvision.data import ImageFolderDataset
    from uqvision.models import load_model
    from uqvision.predict import run_loader
    from uqvision.training.dropout import PerSampleDropout

    loaded = load_model(spec, num_classes=10)
    ds = ImageFolderDataset(folder, loaded.transform)
    cfg = dataclasses.replace(cfg, seed=seed)
    with PerSampleDropout(loaded.model, seed) as dropout:
        return run_loader(loaded, ds, np.arange(len(ds)), cfg, "cpu", cfg.passes, dropout)["logits"]


def test_mc_dropout_computes_the_backbone_once_when_dropout_is_in_the_head(spec, digits):
    """test_byobnet's only dropout is its classifier head's: the backbone runs once per batch,
    the head once per pass, and the logits equal 3 full passes bit for bit (same masks)."""
    cfg = PredictConfig(mode="mc_dropout", passes=3, batch_size=16)
    (ds,) = predict(spec, digits / "test", cfg)
    assert ds.attrs["mc_dropout_path"] == "features_once"
    np.testing.assert_array_equal(ds["logits"].values,
                                  _full_passes(spec, digits / "test", cfg, int(ds.attrs["sample_seed"])))


def test_mc_dropout_with_dropout_in_the_body_runs_full_passes(digits, tmp_path):
    """Dropout inside the blocks (timm's proj_drop_rate) changes the features per pass: the
    check sees a dropout module run in forward_features and falls back to full passes."""
    from uqvision.training.loop import ImageTrainConfig, train_model

    ckpt = train_model(digits / "train", tmp_path / "vit.safetensors", ImageTrainConfig(
        arch="test_vit", epochs=0, input_size=16, drop_rate=0.2,
        model_kwargs={"proj_drop_rate": 0.2})).checkpoint
    spec = f"test_vit={ckpt}"
    cfg = PredictConfig(mode="mc_dropout", passes=2, batch_size=16)
    (ds,) = predict(spec, digits / "test", cfg)
    assert ds.attrs["mc_dropout_path"] == "full_passes"
    np.testing.assert_array_equal(ds["logits"].values,
                                  _full_passes(spec, digits / "test", cfg, int(ds.attrs["sample_seed"])))


# ------------------------------------------------------------------------------------------
# evaluation sets (uqvision.evalsets): class maps, roles, members, identity


def _classes_of(digits, root, names):
    """An image folder of some of the digits' test classes, each under a new folder name."""
    import shutil

    for new, old in names.items():
        shutil.copytree(digits / "test" / old, root / new)
    return root


def test_a_by_index_set_labels_folders_by_the_model_class_index(digits, tmp_path):
    import timm
    from uqmetrics import InputError

    ckpt = tmp_path / "r.pth"  # a model whose class names are not its indices
    torch.save(timm.create_model("test_resnet", num_classes=10).state_dict(), ckpt)
    ckpt.with_suffix(".json").write_text(json.dumps({"classes": [f"c{j}" for j in range(10)]}))
    spec = f"test_resnet={ckpt}"
    folder = _classes_of(digits, tmp_path / "v2", {"3": "3", "7": "7"})
    (ds,) = predict(spec, folder, PredictConfig(eval_set="imagenet-v2", batch_size=32))
    by_folder = {"3": 3, "7": 7}
    assert ds["label"].values.tolist() == [by_folder[s.split("/")[0]]
                                           for s in ds["sample"].values]
    assert list(ds["class"].values) == [f"c{j}" for j in range(10)]
    assert ds["in_folder"].values.tolist() == [int(j in (3, 7)) for j in range(10)]
    assert (ds.attrs["class_mapping"], ds.attrs["class_names_source"]) == ("index", "sidecar")
    assert (ds.attrs["eval_set"], ds.attrs["role"]) == ("imagenet-v2", "shifted")
    assert "eval_member" not in ds.attrs and "corruption" not in ds.attrs
    # by name (the default set), the folder names are not the model's: refused
    with pytest.raises(InputError, match=r"has 2 class\(es\) that model .* does not have"):
        predict(spec, folder, PredictConfig())
    (folder / "n01440764").mkdir()  # a class folder that is no index, before the model runs
    (folder / "n01440764" / "x.png").write_bytes(next((folder / "3").iterdir()).read_bytes())
    with pytest.raises(InputError, match=r"eval set 'imagenet-v2' \(class map by_index.*"
                                         r"0 \.\.\. 9\) has 1 class folder\(s\) that are not a "
                                         r"class index of model .*\['n01440764'\]"):
        predict(spec, folder, PredictConfig(eval_set="imagenet-v2"))


def test_an_ood_set_labels_every_sample_minus_one(spec, digits):
    (ood,) = predict(spec, digits / "test", PredictConfig(eval_set="imagenet-o", batch_size=32))
    (plain,) = predict(spec, digits / "test", PredictConfig(batch_size=32))
    assert (ood["label"].values == -1).all() and ood.sizes["sample"] == 65
    assert (ood["in_folder"].values == 0).all()
    assert (ood.attrs["class_mapping"], ood.attrs["eval_set"], ood.attrs["role"]) == (
        "none", "imagenet-o", "ood")
    np.testing.assert_array_equal(ood["logits"].values, plain["logits"].values)
    assert list(ood["class"].values) == list(plain["class"].values)
    # the default set: the labels and data variables of before evaluation sets
    assert (plain.attrs["eval_set"], plain.attrs["role"]) == ("folder", "clean")
    assert set(plain.data_vars) == {"logits", "label"}
    assert plain.attrs["class_mapping"] == "name"


def test_a_member_of_an_expanded_set_is_recorded_and_named(spec, digits, tmp_path):
    import shutil

    from uqmetrics import InputError

    member = tmp_path / "imagenet-c" / "fog" / "3"
    shutil.copytree(digits / "test", member)
    out = tmp_path / "caches"
    (path,) = predict_to_files(spec, member, out, PredictConfig(eval_set="imagenet-c",
                                                                batch_size=32))
    assert path.name == "test_byobnet+m0.imagenet-c-fog-3.plain-000.nc"
    ds = read_cache(path)
    assert {k: ds.attrs[k] for k in ("eval_set", "role", "eval_member", "corruption",
                                     "severity", "dataset_name")} == {
        "eval_set": "imagenet-c", "role": "shifted", "eval_member": "fog-3",
        "corruption": "fog", "severity": 3, "dataset_name": "imagenet-c-fog-3"}
    (plain,) = predict(spec, digits / "test", PredictConfig(batch_size=32))
    np.testing.assert_array_equal(ds["logits"].values, plain["logits"].values)
    np.testing.assert_array_equal(ds["label"].values, plain["label"].values)
    # the member named: the same caches (resumed); another member's name: refused
    from uqvision.predict import check_caches

    cfg = PredictConfig(eval_set="imagenet-c", eval_member="fog-3", batch_size=32)
    assert check_caches(spec, member, out, cfg)[1] == set()
    with pytest.raises(InputError, match="must end in 'snow/3'"):
        check_caches(spec, member, out, PredictConfig(eval_set="imagenet-c",
                                                      eval_member="snow-3"))
    with pytest.raises(InputError, match="not a member folder of eval set 'imagenet-c'"):
        predict(spec, digits / "test", PredictConfig(eval_set="imagenet-c"))


def test_the_eval_set_is_part_of_a_cache_identity(spec, digits, tmp_path):
    from uqmetrics import InputError, read_dataset, write_dataset

    from uqvision.predict import cache_identity, check_caches

    (path,) = predict_to_files(spec, digits / "test", tmp_path, PredictConfig(batch_size=32))
    with pytest.raises(InputError, match=r"eval_set 'folder' vs 'imagenet-val'"):
        check_caches(spec, digits / "test", tmp_path, PredictConfig(eval_set="imagenet-val"))
    # a cache written before evaluation sets were recorded is of the generic folder set
    old = read_dataset(path)
    for key in ("eval_set", "role"):
        del old.attrs[key]
    config = json.loads(old.attrs["config"])
    del config["eval_set"], config["eval_member"], config["extra_variables"]
    old.attrs["config"] = json.dumps(config)
    moved = tmp_path / "old"
    moved.mkdir()
    write_dataset(old, moved / path.name)
    ident = cache_identity(read_cache(moved / path.name).attrs)
    assert (ident["eval_set"], ident["eval_member"]) == ("folder", "")
    assert check_caches(spec, digits / "test", moved, PredictConfig())[1] == set()
    with pytest.raises(InputError, match=r"eval_set 'folder' vs 'imagenet-o'"):
        check_caches(spec, digits / "test", moved, PredictConfig(eval_set="imagenet-o"))
    with pytest.raises(ValueError, match="unknown eval set 'imagenet-x'"):
        check_caches(spec, digits / "test", moved, PredictConfig(eval_set="imagenet-x"))
