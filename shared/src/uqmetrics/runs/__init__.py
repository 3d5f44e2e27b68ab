"""The running and recording layer of uqmetrics: result files (:mod:`~uqmetrics.runs.io`), the
result schema (:mod:`~uqmetrics.runs.result_schema`), run configurations
(:mod:`~uqmetrics.runs.run_config`, the run being recorded in :mod:`~uqmetrics.runs.current`),
options generated from typed configs (:mod:`~uqmetrics.runs.config_options`), light command
lines (:mod:`~uqmetrics.runs.lazy`), sweeps on Dask and job queues
(:mod:`~uqmetrics.runs.sweep`) and the test support of every package
(:mod:`~uqmetrics.runs.testing`).

It sits above :mod:`uqmetrics.metrics` (which it may import) and below :mod:`uqmetrics.report`
(which it never imports) (``.importlinter``). This face imports nothing, so that a program
importing one of its modules pays for that module alone.
"""
