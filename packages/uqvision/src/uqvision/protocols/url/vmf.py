"""von Mises-Fisher maths of the probabilistic-embedding methods (URL, V.4): defined in
:mod:`uqvision.methods.vmf` (moved there with the heads that sample it, issue 41); this
module keeps the old import path.
"""

from __future__ import annotations

from ...methods.vmf import elk_sim, log_iv, sample_vmf, vmf_log_normalizer

__all__ = ["elk_sim", "log_iv", "sample_vmf", "vmf_log_normalizer"]
