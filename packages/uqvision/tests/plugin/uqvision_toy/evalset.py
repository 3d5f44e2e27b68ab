"""An evaluation set from a plugin: a folder of the model's classes under a shift."""

from uqvision.evalsets import EvalSet

EVAL_SET = EvalSet("toy-shifted", role="shifted", class_map="by_name",
                   description="the toy protocol's shifted test folder (class folders)")
