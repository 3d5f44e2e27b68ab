"""The public names of :mod:`uqvision.models`, re-exported for imports of
``uqvision.models.core`` (where they were all defined before the package was split by concern:
:mod:`~uqvision.models.spec`, :mod:`~uqvision.models.weights`,
:mod:`~uqvision.models.checkpoints`, :mod:`~uqvision.models.sources`). New code imports them
from :mod:`uqvision.models`.
"""

from . import *
from . import __all__ as __all__  # noqa: PLC0414  (the package's list, re-exported)
