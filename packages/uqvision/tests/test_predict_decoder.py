"""The image decoders of a prediction (``PredictConfig.decoder``): JPEGs decoded, resized and
normalised on the device by torchvision (the CPU path here; CUDA is the same code, tested
where there is one), a preprocessing of its own in the caches' identity, and its difference
from Pillow's pixels and logits."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from uqmetrics import InputError, read_dataset, write_dataset

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.data import DataConfig, ImageFolderDataset, eval_transform, load_image
from uqvision.predict import (
    DECODERS,
    PredictConfig,
    cache_identity,
    check_caches,
    decoder_suggestion,
    predict,
    predict_to_files,
)
from uqvision.predict.decoded import split_transform
from uqvision.predict.device_decode import (
    JPEG_MAGIC,
    DeviceTransform,
    EncodedImages,
    decode_batch,
)

TV = PredictConfig(decoder="torchvision", batch_size=16)

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec (README: decoders)
pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning")


@pytest.fixture(scope="module")
def jpegs(digits, tmp_path_factory):
    """The digits test folder as JPEGs (quality 90) of 36 x 28 px, so that the model's
    transform resizes (short side 28 -> 18) and crops (16); one image of class 0 kept a PNG
    (a non-JPEG file under the device decoder)."""
    root = tmp_path_factory.mktemp("jpegs") / "test"
    for k, f in enumerate(sorted((digits / "test").rglob("*.png"))):
        out = root / f.relative_to(digits / "test")
        out.parent.mkdir(parents=True, exist_ok=True)
        img = Image.open(f).convert("RGB").resize((36, 28), Image.BILINEAR)
        if k == 0:
            img.save(out)
        else:
            img.save(out.with_suffix(".jpg"), quality=90)
    return root


def test_the_decoders_are_a_registry_and_refuse_what_they_cannot_do(spec, jpegs, tmp_path):
    assert DECODERS.names() == ["pil", "torchvision"] and DECODERS["torchvision"].on_device
    assert PredictConfig().decoder == "pil"  # the default: timm's own pixels
    with pytest.raises(ValueError, match="unknown decoder 'nvjpeg'"):
        check_caches(spec, jpegs, tmp_path, PredictConfig(decoder="nvjpeg"))
    with pytest.raises(ValueError, match="not mode 'tta'"):  # augmentations work on PIL images
        check_caches(spec, jpegs, tmp_path, PredictConfig(decoder="torchvision", mode="tta"))
    with pytest.raises(InputError, match="predict it with --decoder pil"):
        DeviceTransform.of(lambda img: img, model="odd")  # not resize / crop / normalise


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_device_pixels_are_pillows_within_one_level(jpegs, interpolation):
    """On the CPU both decoders are libjpeg-turbo: the decoded pixels are equal, and the
    resize (Pillow's filter, horizontal pass rounded to 8 bits, then vertical) differs from
    Pillow's fixed-point arithmetic by one level at most, where a float sum falls on the other
    side of a rounding boundary; a PNG is decoded by Pillow in both."""
    folder = ImageFolderDataset(jpegs)
    transform = eval_transform(DataConfig((3, 16, 16), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3),
                                          interpolation=interpolation))
    head = split_transform(transform).head
    enc = EncodedImages(folder, DeviceTransform.of(transform))
    diff, differing, n = 0, 0, 0
    for i in range(0, len(folder), 3):
        rel = folder.samples[i][0]
        item, _, _ = enc[i]
        assert (item.ndim == 1) == rel.endswith(".jpg")
        want = np.asarray(head(load_image(folder.root / rel)), dtype=np.int64)
        (pixels,) = decode_batch([item], "cpu", [rel])
        got = enc.transform.image(pixels).permute(1, 2, 0).numpy().astype(np.int64)
        diff, differing = max(diff, int(np.abs(got - want).max())), differing + int(
            (got != want).sum())
        n += want.size
    assert diff <= 1 and differing / n < 0.01


def test_the_decoder_is_part_of_a_cache_identity(spec, jpegs, tmp_path):
    (path,) = predict_to_files(spec, jpegs, tmp_path / "a", PredictConfig(batch_size=32))
    assert read_cache(path).attrs["decoder"] == "pil"
    with pytest.raises(InputError, match=r"decoder 'pil' vs 'torchvision'"):
        check_caches(spec, jpegs, tmp_path / "a", TV)
    with pytest.raises(InputError, match=r"decoder 'pil' vs 'torchvision'"):
        predict_to_files(spec, jpegs, tmp_path / "a", TV)
    assert read_cache(path).attrs["decoder"] == "pil"  # never replaced nor mixed
    (tv,) = predict_to_files(spec, jpegs, tmp_path / "b", TV)
    cached = read_cache(tv)
    assert cached.attrs["decoder"] == "torchvision"
    assert json.loads(cached.attrs["config"])["decoder"] == "torchvision"
    assert check_caches(spec, jpegs, tmp_path / "b", TV)[1] == set()  # resumed
    with pytest.raises(InputError, match=r"decoder 'torchvision' vs 'pil'"):
        check_caches(spec, jpegs, tmp_path / "b", PredictConfig())
    # a cache written before decoders were recorded was decoded by Pillow: still reused
    old = read_dataset(path)
    del old.attrs["decoder"]
    config = json.loads(old.attrs["config"])
    del config["decoder"]
    old.attrs["config"] = json.dumps(config)
    (tmp_path / "old").mkdir()
    write_dataset(old, tmp_path / "old" / path.name)
    assert cache_identity(read_cache(tmp_path / "old" / path.name).attrs)["decoder"] == "pil"
    assert check_caches(spec, jpegs, tmp_path / "old", PredictConfig())[1] == set()
    with pytest.raises(InputError, match=r"decoder 'pil' vs 'torchvision'"):
        check_caches(spec, jpegs, tmp_path / "old", TV)


def test_logits_of_the_two_decoders_and_top1_agreement(spec, jpegs):
    """The difference in logits, measured. Bound: the inputs differ by one 8-bit level
    (1/255 of the range) on under 1 % of their values (test above), so the logits may move by
    a small multiple of that relative change; we allow tau = 1 % of the logit scale (2.5x
    1/255). A sample whose Pillow top-1 margin exceeds 2 tau cannot change its top-1 when no
    logit moves by more than tau, so the top-1 agreement is at least the share of such
    samples. Measured on this model: max |dz| = 0.2 % of the scale, agreement 1.0."""
    (pil,) = predict(spec, jpegs, PredictConfig(batch_size=16))
    (tv,) = predict(spec, jpegs, TV)
    z, z_tv = pil["logits"].values, tv["logits"].values
    scale = float(np.abs(z).max())
    tau = 0.01 * scale
    dz = float(np.abs(z - z_tv).max())
    top = np.sort(z, axis=1)
    margin = top[:, -1] - top[:, -2]
    agree = z.argmax(1) == z_tv.argmax(1)
    assert 0 < dz <= tau  # a preprocessing of its own, close to Pillow's
    assert agree.mean() >= np.mean(margin > 2 * tau)
    assert agree[margin > 2 * dz].all()  # no flip where the measured change cannot flip one
    assert (tv.attrs["decoder"], pil.attrs["decoder"]) == ("torchvision", "pil")


def test_device_decoding_does_not_depend_on_the_batch_size(spec, jpegs, rounding_tol):
    """Each image is decoded, resized and cropped on its own and normalised elementwise: the
    network's inputs are bit-identical at batch sizes 4 and 16 (and 1); the logits then differ
    only by the float rounding of the network's batched kernels, as for Pillow's
    (test_predict.py), and not at all with the work of a loader worker."""
    folder = ImageFolderDataset(jpegs)
    transform = eval_transform(DataConfig((3, 16, 16), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    enc = EncodedImages(folder, DeviceTransform.of(transform))
    idx = list(range(24))

    def inputs(bs):
        return torch.cat([enc.to_device([enc[i][0] for i in idx[s:s + bs]], idx[s:s + bs],
                                        "cpu") for s in range(0, len(idx), bs)])

    x16 = inputs(16)
    assert torch.equal(inputs(4), x16) and torch.equal(inputs(1), x16)
    (a,) = predict(spec, jpegs, PredictConfig(decoder="torchvision", batch_size=4))
    (b,) = predict(spec, jpegs, PredictConfig(decoder="torchvision", batch_size=16))
    np.testing.assert_allclose(a["logits"].values, b["logits"].values,
                               **rounding_tol(spec, b["logits"].values))
    # a loader worker reads the bytes (sent as numpy arrays): the same logits bit for bit
    (w,) = predict(spec, jpegs, PredictConfig(decoder="torchvision", batch_size=16,
                                              num_workers=1))
    np.testing.assert_array_equal(w["logits"].values, b["logits"].values)


def test_mc_dropout_and_a_shared_pillow_file_under_the_device_decoder(spec, jpegs, tmp_path):
    from uqvision.data import folder_fingerprint
    from uqvision.predict.decoded import decode_images

    (mc,) = predict(spec, jpegs, PredictConfig(decoder="torchvision", mode="mc_dropout",
                                               passes=2, batch_size=32))
    assert mc["logits"].shape[:2] == (2, 65) and mc.attrs["decoder"] == "torchvision"
    # a sweep's file of Pillow's pixels is never read by the device decoder
    folder = ImageFolderDataset(jpegs)
    from uqvision.training.runs import load_run

    split = split_transform(load_run(spec).loaded.transform)
    made = decode_images(folder, split, tmp_path / "d.npy", folder_fingerprint(folder))
    (shared,) = predict(spec, jpegs, TV, decoded=made.path)
    (own,) = predict(spec, jpegs, TV)
    assert "shared_decoding" not in shared.attrs
    np.testing.assert_array_equal(shared["logits"].values, own["logits"].values)


def test_a_jpeg_the_device_cannot_decode_is_named(jpegs):
    from uqvision.exceptions import BadImageError

    good = torch.frombuffer(bytearray(next(jpegs.rglob("*.jpg")).read_bytes()),
                            dtype=torch.uint8)
    bad = torch.frombuffer(bytearray(JPEG_MAGIC + b"\x00" * 64), dtype=torch.uint8)
    with pytest.raises(BadImageError, match="'b.jpg': torchvision.io.decode_jpeg cannot"):
        decode_batch([good, bad], "cpu", ["a.jpg", "b.jpg"])


def test_the_dry_run_suggests_the_gpu_decoder_where_cuda_is(spec, jpegs, tmp_path, capsys):
    assert decoder_suggestion("pil", "cpu", cuda_available=False) is None
    assert decoder_suggestion("torchvision", "cuda", cuda_available=True) is None
    assert "--decoder torchvision" in decoder_suggestion("pil", "cuda", cuda_available=True)
    assert "with --device cuda" in decoder_suggestion("pil", "cpu", cuda_available=True)
    from uqvision.cli.predict import dry_run_lines

    lines = dry_run_lines(["m"], [({(0, 0): tmp_path / "x.nc"}, {(0, 0)})],
                          PredictConfig(device="cpu"), cuda_available=True)
    assert lines[0].startswith("m: 1 of 1 cache(s) to compute") and "suggestion" in lines[1]
    capsys.readouterr()
    assert main(["predict", "--model", spec, "--data", str(jpegs), "--out",
                 str(tmp_path / "c"), "--decoder", "torchvision", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 cache(s) to compute" in out and "decoder torchvision" in out
    assert "suggestion" not in out and not (tmp_path / "c").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nvJPEG)")
def test_nvjpeg_on_cuda_is_reproducible_and_close_to_the_cpu(spec, jpegs):
    cuda = PredictConfig(decoder="torchvision", batch_size=16, device="cuda")
    (a,) = predict(spec, jpegs, cuda)
    (b,) = predict(spec, jpegs, cuda)
    (cpu,) = predict(spec, jpegs, TV)
    np.testing.assert_array_equal(a["logits"].values, b["logits"].values)
    z, z_gpu = cpu["logits"].values, a["logits"].values
    scale = float(np.abs(z).max())
    top = np.sort(z, axis=1)
    agree = z.argmax(1) == z_gpu.argmax(1)
    assert agree.mean() >= np.mean(top[:, -1] - top[:, -2] > 0.02 * scale)
    assert a.attrs["decoder"] == "torchvision" and a.attrs["device"].startswith("cuda")
