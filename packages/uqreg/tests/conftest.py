import torch
from uqmetrics.runs.testing import register_profiles

register_profiles()
# The test machines are small and shared; one intra-op thread keeps timings stable and the
# batched-vs-loop comparisons free of thread-count-dependent reduction orders.
torch.set_num_threads(1)
