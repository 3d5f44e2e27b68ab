import pytest
import torch
from uqmetrics.runs.testing import register_profiles

register_profiles()
# The test machines are small and shared; one intra-op thread keeps timings stable and the
# batched-vs-loop comparisons free of thread-count-dependent reduction orders.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def scheduler():
    """An in-process Dask cluster (one worker thread) the CLI connects to with --scheduler."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address
