"""uqvision: image-classification uncertainty protocols on timm models."""

__version__ = "0.1.0"
