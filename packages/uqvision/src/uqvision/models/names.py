"""Which model to run: :class:`ModelSpec`, a model's name (``arch[.tag]``, ``<source>/<name>``)
with its optional checkpoint and its row label, as the command line gives it (``NAME`` or
``NAME=CHECKPOINT``) and as every model module reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """Which model to run.

    Parameters
    ----------
    name : str
        A timm name, ``arch`` or ``arch.tag`` (e.g. ``resnet50.a1_in1k``), or ``tv/<name>`` for a
        torchvision model (e.g. ``tv/mobilenet_v3_small``).
    checkpoint : path, optional
        Local weights (``.safetensors``/``.pth``/``.bin``), head included.
    label : str, optional
        The row name in results; default ``name`` or ``name@<checkpoint stem>``.

    Examples
    --------
    >>> spec = ModelSpec.parse("tv/resnet18=/w/rn.pth")
    >>> spec.source, spec.model_name, spec.row
    ('tv', 'resnet18', 'tv/resnet18@rn')
    """

    name: str
    checkpoint: str | None = None
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``NAME`` or ``NAME=CHECKPOINT`` (the CLI syntax)."""
        name, _, ckpt = text.partition("=")
        return cls(name.strip(), ckpt.strip() or None)

    @property
    def source(self) -> str:
        return self.name.split("/", 1)[0] if "/" in self.name else "timm"

    @property
    def model_name(self) -> str:
        return self.name.split("/", 1)[1] if "/" in self.name else self.name

    @property
    def row(self) -> str:
        if self.label:
            return self.label
        return self.name if self.checkpoint is None else f"{self.name}@{Path(self.checkpoint).stem}"


def _spec(spec: ModelSpec | str) -> ModelSpec:
    return ModelSpec.parse(spec) if isinstance(spec, str) else spec
