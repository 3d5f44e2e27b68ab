"""Images per second of each ImageNet-C corruption (uqvision.data.corruptions) at 224 px.

Usage: ``python benchmarks/bench_corruptions.py [--images N] [--severity S]``. Random 224 px
RGB crops through the reference functions (no JPEG encoding); a table, slowest first.
"""

import argparse
import time

import numpy as np

from uqvision.data.corruptions import CORRUPTIONS, _corrupt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--images", type=int, default=3)
    p.add_argument("--severity", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (a.images, a.size, a.size, 3), dtype=np.uint8)
    _corrupt(imgs[0], "fog", 1, 0)  # import and first-call costs out of the timings
    rows = []
    for c in CORRUPTIONS:
        t = time.perf_counter()
        for i, img in enumerate(imgs):
            _corrupt(img, c, a.severity, i)
        rows.append((a.images / (time.perf_counter() - t), c))
    print(f"{'corruption':<18} images/s  ({a.size} px, severity {a.severity}, {a.images} images)")
    for rate, c in sorted(rows):
        print(f"{c:<18} {rate:9.2f}")


if __name__ == "__main__":
    main()
