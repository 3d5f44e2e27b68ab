"""uqmetrics' feature detectors against pytorch-ood's (>= 0.4), fit + score, side by side in one run.

Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/bench_detectors.py
        [--sizes small,large] [--device cpu|cuda] [--rounds 3] [--threads 2]
        [--detectors mahalanobis,knn,vim] [--backend auto|numpy|torch]

Sizes (the issue's): ``small`` 20,000 fit features of 512 dimensions, 100 classes, 10,000
scored; ``large`` 200,000 x 2048, 1,000 classes, 10,000 scored (OpenOOD fits KNN on ImageNet's
training features, up to 1.28 M x 2048). The features are Gaussian clusters around class centres
(as a trained network's), the scored half in-distribution, half shifted; the head is random.
Both sides are handed the same float32 arrays (pytorch-ood torch tensors, uqmetrics numpy) and
time the fit and the scoring of the scored set:

- ``mahalanobis``: :func:`uqmetrics.metrics.detectors.get_detector` ``("mahalanobis")`` vs
  ``pytorch_ood.detector.Mahalanobis`` (``fit_features`` + ``predict_features``);
- ``knn`` (k = 50): ours with its default backend (``auto``: faiss when installed; ``torch:cuda``
  with ``--device cuda``) vs ``pytorch_ood.detector.KNN`` (scikit-learn's ``NearestNeighbors``);
- ``vim`` (D = 256 for 512 features, 1000 for 2048): ours vs ``pytorch_ood.detector.ViM``.

With ``--device cuda`` pytorch-ood's tensors are on the device (its KNN still searches on the
CPU, through scikit-learn), and ours run with the backend ``torch:cuda`` (the detectors'
``backend`` parameter: fit and scoring on the device). ``--backend`` picks our backend otherwise:
``auto`` (the default) is the detectors' default on the CPU (numpy for Mahalanobis and ViM,
faiss for KNN) and ``torch:<device>`` on CUDA; ``numpy`` / ``torch`` force that backend
(``torch`` = ``torch:<device>``, e.g. torch on the CPU against numpy, for information).
On CUDA both sides first run every detector once on a small set of the same feature dimension,
untimed (CUDA loads its libraries and kernels on first use). Each round times every detector on
both sides, interleaved; the ratios are taken within a round
and the medians over rounds printed: ``RESULT <detector>_vs_pytorch_ood=<ratio>`` (pytorch-ood's
time / ours: >= 1.0 means ahead; the issue's target). ``DETAIL`` lines: the median seconds of each
side (wall, and the process's CPU seconds: on a busy machine the steadier measure of the work),
each side's AUROC of the shifted half against the in-distribution half (the two must
agree), the threads and the load average. Timings on a shared machine move with its load: compare
numbers of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from uqmetrics.metrics.detectors import get_detector, vim_dimension
from uqmetrics.metrics.ood import ood_auroc_score

SIZES = {"small": (20_000, 512, 100, 10_000), "large": (200_000, 2048, 1000, 10_000)}
DETECTORS = ("mahalanobis", "knn", "vim")


def _load() -> str:
    p = Path("/proc/loadavg")
    return " ".join(p.read_text().split()[:3]) if p.exists() else "?"


def make_data(n_fit: int, d: int, n_classes: int, n_score: int, seed: int = 0) -> dict:
    """float32 fit features and labels, scored features (first half in-distribution, second
    half shifted), a head (w, b)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, size=(n_classes, d)).astype(np.float32)
    y = np.arange(n_fit) % n_classes
    x_fit = centres[y] + rng.standard_normal((n_fit, d), dtype=np.float32)
    half = n_score // 2
    x = np.r_[centres[rng.integers(0, n_classes, half)]
              + rng.standard_normal((half, d), dtype=np.float32),
              0.5 * centres[rng.integers(0, n_classes, n_score - half)]
              + 1.3 * rng.standard_normal((n_score - half, d), dtype=np.float32)]
    w = (rng.normal(size=(n_classes, d)) / np.sqrt(d)).astype(np.float32)
    b = rng.normal(0, 0.1, size=n_classes).astype(np.float32)
    return {"x_fit": x_fit, "y": y, "x": x.astype(np.float32), "w": w, "b": b, "half": half}


def our_backend(device: str, backend: str = "auto") -> str:
    """Our detectors' ``backend`` parameter for ``--device`` and ``--backend``."""
    if backend == "torch" or (backend == "auto" and device.startswith("cuda")):
        return f"torch:{device}"
    return backend


def ours(name: str, data: dict, device: str, backend: str = "auto") -> np.ndarray:
    det = get_detector(name).with_params(backend=our_backend(device, backend))
    fit = {"embedding": data["x_fit"], "labels": data["y"], "head_weight": data["w"],
           "head_bias": data["b"]}
    scorer = det.fitted({k: fit[k] for k in det.fit_keys})
    return scorer({"embedding": data["x"], "head_weight": data["w"], "head_bias": data["b"]})


def theirs(name: str, data: dict, device: str) -> np.ndarray:
    from pytorch_ood.detector import KNN, Mahalanobis, ViM

    t = {k: torch.from_numpy(data[k]).to(device) for k in ("x_fit", "x", "w", "b")}
    y = torch.from_numpy(data["y"]).to(device)
    if name == "mahalanobis":
        det = Mahalanobis(None).fit_features(t["x_fit"], y)
    elif name == "knn":
        det = KNN(None, k=50).fit_features(t["x_fit"].cpu(), y.cpu())
    else:
        det = ViM(None, d=vim_dimension(data["x_fit"].shape[1]), w=t["w"], b=t["b"])
        det.fit_features(t["x_fit"], y)
    u = det.predict_features(t["x"])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return u.cpu().numpy()


def _timed(func, *args) -> tuple[float, float, np.ndarray]:
    """(wall seconds, CPU seconds of the process, u)."""
    t0, c0 = time.perf_counter(), time.process_time()
    u = func(*args)
    if args[-1].startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0, u


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="small",
                    help=f"comma-separated, of {', '.join(SIZES)} (default small)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch, BLAS and OpenMP threads of both sides (default 2)")
    ap.add_argument("--detectors", default=",".join(DETECTORS),
                    help=f"comma-separated, of {', '.join(DETECTORS)}")
    ap.add_argument("--backend", default="auto", choices=("auto", "numpy", "torch"),
                    help="our detectors' backend: auto = their default on the CPU, "
                         "torch:<device> on CUDA; torch = torch:<device> (default auto)")
    a = ap.parse_args()
    sizes = [s for s in a.sizes.split(",") if s]
    dets = [d for d in a.detectors.split(",") if d]
    bad = [s for s in sizes if s not in SIZES] + [d for d in dets if d not in DETECTORS]
    if bad or a.rounds < 1 or a.threads < 1:
        ap.error(f"unknown sizes/detectors {bad} or rounds/threads < 1")
    torch.set_num_threads(a.threads)
    with threadpool_limits(a.threads):  # numpy's BLAS, faiss's and scikit-learn's OpenMP
        for size in sizes:
            n_fit, d, n_classes, n_score = SIZES[size]
            data = make_data(n_fit, d, n_classes, n_score)
            if a.device.startswith("cuda"):  # CUDA's lazy start-up (cuBLAS, cuSOLVER, kernels
                warm = make_data(2 * n_classes, d, n_classes, 200, seed=1)  # loaded on first
                for k in dets:                                               # use), untimed
                    ours(k, warm, a.device, backend=a.backend)
                    theirs(k, warm, a.device)
            ratios = {k: [] for k in dets}
            secs = {(k, side): [] for k in dets for side in ("ours", "theirs")}
            cpu = {(k, side): [] for k in dets for side in ("ours", "theirs")}
            aurocs = {}
            for r in range(a.rounds):
                for k in dets:
                    sides = (("ours", lambda *args: ours(*args, backend=a.backend)),
                             ("theirs", theirs))
                    for side, func in sides[::1 - 2 * (r % 2)]:
                        s, c, u = _timed(func, k, data, a.device)
                        secs[k, side].append(s)
                        cpu[k, side].append(c)
                        h = data["half"]
                        aurocs[k, side] = float(ood_auroc_score(u[:h], u[h:]))
                    ratios[k].append(secs[k, "theirs"][-1] / secs[k, "ours"][-1])
            tag = f"{size} {n_fit}x{d} {n_classes} classes {n_score} scored"
            for k in dets:
                print(f"DETAIL {k} {tag}: ours {statistics.median(secs[k, 'ours']):.3f} s, "
                      f"pytorch-ood {statistics.median(secs[k, 'theirs']):.3f} s (CPU seconds "
                      f"{statistics.median(cpu[k, 'ours']):.3f} vs "
                      f"{statistics.median(cpu[k, 'theirs']):.3f}); AUROC ours "
                      f"{aurocs[k, 'ours']:.6f} pytorch-ood {aurocs[k, 'theirs']:.6f}", flush=True)
            suffix = "" if size == "small" else f"_{size}"
            for k in dets:
                print(f"RESULT {k}_vs_pytorch_ood{suffix}={statistics.median(ratios[k]):.2f}",
                      flush=True)
    print(f"DETAIL device {a.device}, ours with backend {our_backend(a.device, a.backend)}, "
          f"threads {a.threads}, rounds {a.rounds}, load {_load()}")


if __name__ == "__main__":
    main()
