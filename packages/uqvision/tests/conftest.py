"""Shared fixtures: a small digits folder, one trained tiny checkpoint, synthetic caches."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def _install_plugin() -> Path:
    """Install tests/plugin (the toy plugin: a protocol, a training method, a model source, an
    evaluation set and a detector, each behind an entry point) with pip into a temporary
    folder, put it first on ``sys.path`` and on ``PYTHONPATH`` (for the subprocesses the tests
    start) and register its entries (:func:`uqvision.load_plugins`), before any test module
    is imported: every registry-driven test runs over them too. The source is copied first, so
    that the build leaves nothing in the repository."""
    tmp = Path(tempfile.mkdtemp(prefix="uqvision-plugin-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    shutil.copytree(PLUGIN, tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                    "--target", str(tmp / "site"), str(tmp / "src")], check=True)
    sys.path.insert(0, str(tmp / "site"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tmp / "site"), os.environ.get("PYTHONPATH")) if p)
    # pytest imported uqvision already (its warning filters name uqvision.exceptions): load the
    # plugins again, which registers the ones installed since
    import uqvision

    broken = {g: b for g, b in uqvision.load_plugins().items() if b}
    if broken:
        raise RuntimeError(f"the toy plugin did not load: {broken}")
    return tmp / "site"


#: The toy plugin's source, and where the test session installed it.
PLUGIN = Path(__file__).parent / "plugin"
PLUGIN_SITE = _install_plugin()

import torch

# One intra-op thread: the tests are tiny, and on a shared 2-core machine OpenMP threads that
# spin-wait for each other are several times slower than a single thread.
torch.set_num_threads(1)

from uqmetrics import write_dataset

from uqvision.cache import cache_dataset, cache_key
from uqvision.data import make_digits_folder

ARCH = "test_byobnet"  # BatchNorm + an nn.Dropout head, ~0.2M parameters


@pytest.fixture(autouse=True)
def _predict_in_process(monkeypatch):
    """Predictions decode their images in the test process unless a test names a worker
    count: the test folders are a few batches of tiny images, for which starting DataLoader
    workers (``PredictConfig.num_workers=None``, :func:`uqvision.runtime.loader_workers`: one
    here, where the tests run one torch thread on 2 cores) costs more than it saves
    (test_predict.py took 1.8x as long). The rule itself is tested in test_predict_costs.py."""
    import importlib

    module = importlib.import_module("uqvision.predict.loop")  # where _batches calls it
    monkeypatch.setattr(module, "loader_workers", lambda requested, n_batches, device="cpu":
                        0 if requested is None else requested)


@pytest.fixture(scope="module", autouse=True)
def _dask_globals_kept_per_module():
    """dask's global ``scheduler`` setting and default clients as they were before each test
    module. A thread-based test cluster (``LocalCluster(processes=False)``) runs its tasks in
    this process: a task's ``get_client()`` registers a client as the process's default and
    sets ``scheduler="dask.distributed"``, and a cluster closed under a task leaves that client
    registered. xarray's netCDF writes in later modules then ask dask for that scheduler
    ("no Client active", "ConnectionPool is closed"). Test hygiene only: a sweep's own
    cluster runs its workers in processes."""
    import dask
    import distributed.client as dc

    before = dask.config.get("scheduler", None)
    yield
    for c in list(dc._global_clients.values()):
        dc._del_global_client(c)
    if before is None:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.set(scheduler=before)


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """13 images per class: 65 train / 65 test images (an odd count, for uneven shards)."""
    return make_digits_folder(tmp_path_factory.mktemp("data") / "digits", max_per_class=13)


@pytest.fixture(scope="session")
def trained(digits, tmp_path_factory):
    """One test_byobnet trained for 2 epochs at 16 px (with head dropout; AdamW + OneCycle,
    uqvision's former recipe)."""
    from uqvision.training.loop import ADAMW_RECIPE, ImageTrainConfig, train_model

    out = tmp_path_factory.mktemp("models") / "m0.safetensors"
    return train_model(digits / "train", out, ImageTrainConfig(
        arch=ARCH, epochs=2, input_size=16, drop_rate=0.2, batch_size=32, seed=0,
        hparams=ADAMW_RECIPE))


@pytest.fixture
def edited_run(trained, tmp_path):
    """``edited_run(pretrained_cfg, keep=True) -> (checkpoint, sidecar)``: a copy (in
    ``tmp_path/models``) of the session's trained run whose sidecar's ``pretrained_cfg`` is
    ``pretrained_cfg`` laid over its preprocessing (``keep``: its input size, mean and std kept;
    else replaced whole), as a file received from someone else could have it."""
    import json

    def make(pretrained_cfg: dict, *, keep: bool = True) -> tuple[Path, Path]:
        folder = tmp_path / "models"
        folder.mkdir(exist_ok=True)
        for f in trained.checkpoint.parent.glob(trained.checkpoint.stem + ".*"):
            shutil.copy(f, folder / f.name)
        sidecar = folder / trained.checkpoint.with_suffix(".json").name
        side = json.loads(sidecar.read_text())
        kept = {k: v for k, v in side["pretrained_cfg"].items()
                if k in ("input_size", "mean", "std")} if keep else {}
        sidecar.write_text(json.dumps({**side, "pretrained_cfg": {**kept, **pretrained_cfg}}))
        return folder / trained.checkpoint.name, sidecar

    return make


@pytest.fixture(scope="session")
def spec(trained):
    return f"{ARCH}={trained.checkpoint}"


def _write_cache(directory, logits, labels, *, model, mode="plain", pass_index=0, samples=None,
                classes=None, dataset_name="test", method=None, run=None, sample_index=0):
    """Write a synthetic cache (as `uqvision predict` would) and return its path; ``method``
    (with ``run`` and ``sample_index``) as for a run trained by uqvision."""
    logits = np.asarray(logits, dtype=np.float32)
    n, c = logits.shape[-2:]
    samples = [f"{i:05d}.png" for i in range(n)] if samples is None else samples
    classes = [f"c{j}" for j in range(c)] if classes is None else classes
    attrs = {"model": model, "dataset_name": dataset_name, "mode": mode,
             "pass_index": pass_index}
    if method is not None:
        attrs.update(method=method, run=run or model, sample_index=sample_index)
    ds = cache_dataset(logits, labels, samples=samples, classes=classes, attrs=attrs)
    return write_dataset(ds, directory / f"{cache_key(model, dataset_name, mode, pass_index)}.nc")


def _member_logits(rng, n, c, k, *, signal=2.0, noise=1.5):
    """Labels and k members' logits: a shared signal on the true class plus independent noise."""
    y = rng.integers(0, c, n)
    base = rng.normal(size=(n, c))
    base[np.arange(n), y] += signal
    return y, np.stack([base + noise * rng.normal(size=(n, c)) for _ in range(k)])


#: float32 machine epsilon, 2u (u the unit roundoff).
EPS32 = float(np.finfo(np.float32).eps)


def _reduction_length(net: torch.nn.Module) -> int:
    """N: the number of rounded additions, summed over the network's depth, behind one output.

    Every conv / linear layer sums ``fan_in`` products per output element, a LayerNorm sums its
    normalised size, a (timm) attention block sums ``head_dim`` products for q.k and one per
    token for attn.v. The other sums (global pooling, softmax, an L2 normalisation: a few
    hundred terms at most) add < 10 % to N, < 5 % to sqrt(N).
    """
    tokens = max((int(getattr(m, "num_patches", 0)) for m in net.modules()), default=0) + 1
    n = 0
    for m in net.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)):
            n += m.weight[0].numel()
        elif isinstance(m, torch.nn.LayerNorm):
            n += math.prod(m.normalized_shape)
        elif hasattr(m, "head_dim") and hasattr(m, "num_heads"):
            n += int(m.head_dim) + tokens
    return n


def _rounding_tol(net, reference) -> dict:
    """``assert_allclose`` tolerance between two float32 evaluations of ``net`` that differ only in
    how their kernels order the sums: another batch size or shard (BLAS and oneDNN block by batch;
    a batch of one even takes another convolution backend), another process, and on another CPU
    another vector width, FMA use or MKL kernel.

    Derivation (random-walk model of rounding: Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., sec. 3.1; Higham & Mary, SIAM J. Sci. Comput. 41, 2019): each of the N
    rounded additions behind one output (:func:`_reduction_length`) errs by at most u times its
    partial sum, and the errors of one evaluation add up like a random walk, standard deviation
    ~ sqrt(N) u S. S = max |reference| is the scale of the outputs: the layers are piecewise
    linear, so a relative error in a layer's output reaches the network's output as a relative
    error of the same size. Two independently rounded evaluations differ by sqrt(2) times that;
    the tolerance 4 sqrt(N) eps S = 8 sqrt(N) u S is 5.7 of those standard deviations, e.g.
    2.6e-5 S for test_byobnet (N = 3059), 3.4e-5 S for test_resnet (N = 5099); the batch-size,
    process and forced-kernel (ATen default/AVX2/AVX-512, MKL AVX2 and CNR, oneDNN SSE4.1/AVX2)
    differences of this suite's caches measured at most 3 % of it. ``net`` is a module or a model
    spec (loaded through ``load_run``).
    """
    if isinstance(net, str):
        from uqvision.training.runs import load_run

        net = load_run(net, allow_random_init=True).loaded.model
    scale = float(np.max(np.abs(np.asarray(reference, dtype=np.float64))))
    return {"rtol": 0.0, "atol": 4 * math.sqrt(_reduction_length(net)) * EPS32 * scale}


@pytest.fixture
def rounding_tol():
    """``rounding_tol(net_or_spec, reference) -> {"rtol", "atol"}``: the float32 rounding
    tolerance of two differently blocked evaluations of the network (:func:`_rounding_tol`)."""
    return _rounding_tol


@pytest.fixture
def write_cache():
    """``write_cache(dir, logits, labels, *, model, mode, pass_index, samples, classes)``."""
    return _write_cache


@pytest.fixture
def refused(capsys):
    """``refused(argv) -> line``: run ``uqvision`` with ``argv`` (items made strings) and
    assert a user's mistake: exit code 2, ONE line on stderr and no traceback; that line."""
    from uqvision.cli import main

    def run(argv) -> str:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # the parser's own errors
            code = exc.code
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2, err
        assert len(lines) == 1 and "Traceback" not in err, err
        return lines[0]

    return run


def _one_class_folder(root: Path) -> Path:
    """An OOD folder of one class, ``root/noise``: 6 noise images of 20 x 20 px (seeded)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "noise").mkdir(parents=True)
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            root / "noise" / f"n{i}.png")
    return root


@pytest.fixture
def one_class_folder():
    """``one_class_folder(root) -> root``: an OOD folder of one class (6 noise images)."""
    return _one_class_folder


@pytest.fixture
def member_logits():
    """``member_logits(rng, n, c, k) -> (labels (n,), logits (k, n, c))``."""
    return _member_logits


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """``smoke_run(name) -> (out, path)``: the protocol's ``uqvision reproduce NAME --scale
    smoke`` with its :attr:`~uqvision.protocols.Protocol.smoke_options`, made once per test
    run (the first pytest-xdist worker to need it makes it, the others wait and read it:
    :func:`uqmetrics.runs.testing.once.once_per_run`) and shared by the protocol's own tests,
    ``test_protocols_common.py``, ``test_verify.py`` and the others that read it. Tests write
    their own files to their tmp_path, but for two kinds of writes into a run, which its
    readers in other processes allow for: uimnet's test adds ``again.json``, and the
    pitfalls test reruns the reproduction in place, which rewrites some of its
    files (the score file, figures, summary, record) atomically, to the same results."""
    from uqmetrics.runs.testing.once import once_per_run, shared_root

    from uqvision.protocols import VISION_PROTOCOLS

    root = shared_root(tmp_path_factory.getbasetemp()) / "smoke-runs"
    runs: dict[str, tuple] = {}

    def make(name: str, folder: Path) -> str | None:
        proto = VISION_PROTOCOLS.lookup(name)
        path = proto.reproduce.run(folder / name, scale="smoke", options=dict(proto.smoke_options),
                                   log=lambda *a: None)
        return None if path is None else str(path)

    def run(name: str):
        if name not in runs:
            path = once_per_run(root, name, lambda folder: make(name, folder))
            runs[name] = (root / name / name, None if path is None else Path(path))
        return runs[name]

    return run
