"""Small helpers of the data modules that the layers above use too: seeds derived from integer
keys (:func:`derive_seed`, the augmentations' and the methods' per-sample seeds), the CPU's
subnormal-float mode (:func:`flush_denormal`) and versioned JSON files written atomically
(:func:`write_format_json`, :func:`read_format_json`: index files, UIMNET's split file).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["derive_seed", "flush_denormal", "read_format_json", "write_format_json"]


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (``numpy.random.SeedSequence``).

    Used for per-pass and per-sample augmentation seeds so that an augmentation depends only on
    (seed, pass, sample index) — not on batch size, worker count or process sharding.

    Examples
    --------
    >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(0, 2)
    True
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


@contextlib.contextmanager
def flush_denormal():
    """Flush subnormal floats to zero on CPU while inside (restores PyTorch's default after).

    Small grey-level images (zero padding, near-constant inputs) produce subnormal activations
    and gradients that slow CPU convolutions and BatchNorm several-fold.
    """
    import torch  # around a network's work: torch is there (this module needs none)

    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def write_format_json(obj: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write ``obj`` as JSON atomically (a temporary file beside ``out``, then renamed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, out)
    return out


def read_format_json(path: str | os.PathLike, fmt: dict[str, Any]) -> dict[str, Any]:
    """Read a JSON file; ``ValueError`` unless its format and version are ``fmt``'s."""
    meta = json.loads(Path(path).read_text())
    if any(meta.get(k) != v for k, v in fmt.items()):
        raise ValueError(f"{str(path)!r} is not a {fmt} file")
    return meta
