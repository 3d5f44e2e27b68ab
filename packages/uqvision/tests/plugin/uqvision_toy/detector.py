"""An OOD detector from a plugin: the maximum logit, negated (Hendrycks et al. 2022, "Scaling
out-of-distribution detection for real-world settings")."""

from uqmetrics.metrics.detectors import Detector

DETECTOR = Detector("toy_max_logit", "maximum logit, negated (plugin)", frozenset({"logits"}),
                    lambda inputs, fit: -inputs["logits"].max(axis=1),
                    reference="Hendrycks et al. (2022), Scaling out-of-distribution detection "
                              "for real-world settings")
