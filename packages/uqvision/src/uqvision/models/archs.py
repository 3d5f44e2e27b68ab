"""Architectures uqvision adds to timm's registry (registered when uqvision is imported).

``uqvision_cnn``: a small CNN for the 32×32 stand-in images (docs/conventions.md#v-0), the CPU
stand-in for the papers' ResNet-18/50. It is a real timm model: ``timm.create_model("uqvision_cnn",
num_classes=C, width=8)`` builds it, local weights load through timm's pretrained-file overlay,
and it has timm's classifier interface (``forward_features``, ``forward_head(pre_logits=...)``,
``get_classifier``, ``reset_classifier``), so every training method, :func:`uqvision.training.loop.
train_model` and the one prediction path run it like any other timm architecture.
"""

from __future__ import annotations

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

__all__ = ["SmallCNN", "uqvision_cnn"]


class SmallCNN(nn.Module):
    """Three stages of (conv 3×3 - BN - ReLU) × 2 + 2×2 max-pool, global average pooling and a
    linear classifier; widths ``width, 2·width, 4·width`` (features of size ``4·width``).

    Parameters
    ----------
    num_classes : int
        Classifier outputs; 0 gives the pooled features (timm's convention).
    in_chans : int
    width : int
        Channels of the first stage.
    drop_rate : float
        Dropout before the classifier (timm's ``drop_rate``).

    Shapes: input (n, in_chans, H, W) with H, W divisible by 8; output (n, num_classes).
    """

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, width: int = 32,
                 drop_rate: float = 0.0, **kwargs):
        super().__init__()
        if kwargs.pop("global_pool", "avg") != "avg":
            raise ValueError("uqvision_cnn pools by the average only (global_pool='avg')")
        if kwargs:  # what Python says of a keyword it does not take (check_model_kwargs)
            raise TypeError(f"SmallCNN.__init__() got an unexpected keyword argument "
                            f"{min(kwargs)!r} (it takes num_classes, in_chans, width, "
                            "drop_rate)")
        if int(width) < 1:
            raise ValueError(f"width must be >= 1, got {width!r}")
        layers, c = [], in_chans
        for out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(),
                       nn.Conv2d(out, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(), nn.MaxPool2d(2)]
            c = out
        self.stages = nn.Sequential(*layers)
        self.num_features = self.head_hidden_size = c
        self.num_classes = int(num_classes)
        self.drop_rate = float(drop_rate)
        self.head_drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(c, num_classes) if num_classes else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Feature maps, shape (n, 4·width, H/8, W/8)."""
        return self.stages(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled features (n, 4·width) with ``pre_logits``, else logits (n, num_classes)."""
        x = self.head_drop(x.mean((2, 3)))
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = int(num_classes)
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()


default_cfgs = generate_default_cfgs({
    "uqvision_cnn": {"num_classes": 0, "input_size": (3, 32, 32), "pool_size": (4, 4),
                     "crop_pct": 1.0, "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5),
                     "std": (0.5, 0.5, 0.5), "first_conv": "stages.0", "classifier": "fc"},
})


@register_model
def uqvision_cnn(pretrained: bool = False, **kwargs) -> SmallCNN:
    """The small CNN (:class:`SmallCNN`) through timm's builder (pretrained = a local file)."""
    return build_model_with_cfg(SmallCNN, "uqvision_cnn", pretrained, **kwargs)
