"""How long ``--help`` takes, next to ``python -c "import torch"`` measured side by side: each
command in a fresh interpreter, the rounds interleaved (one of each per round, so that a busy
machine slows every side alike), the median of the rounds and its ratio to the import of torch
(issue 37: ``uqvision --help`` and every ``<command> --help`` within a second; they import
neither torch, timm nor Dask, which packages/uqvision/tests/test_fast_help.py and
packages/uqreg/tests/test_fast_help.py check; docs/conventions.md#fast-help).

Usage: ``python benchmarks/help_startup.py [--rounds 5] [--all]``, with the interpreter of an
environment where uqvision and/or uqreg are installed (a tool that is not is left out, said in
one line). Default: ``uqvision --help`` and a help of each kind (a command, a protocol's score
and reproduce, a dataset maker, the sweep), ``uqreg --help`` and ``uqreg study --help``;
``--all``: every command and sub-command of both. Prints one line per command and a last line
``RESULT help_startup worst=<seconds> worst_ratio=<ratio to import torch>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time

#: The helps timed by default (the tool, then its arguments before ``--help``).
DEFAULT = [("uqvision",), ("uqvision", "train"), ("uqvision", "predict"),
           ("uqvision", "sweep"), ("uqvision", "score", "ood"),
           ("uqvision", "reproduce", "selective"), ("uqvision", "data", "imagenet-c"),
           ("uqreg",), ("uqreg", "study")]


def _every(tool: str) -> list[tuple[str, ...]]:
    """Every command and sub-command of ``tool``, as its parser lists them (built complete
    here, in this process: torch may load here, not in the timed ones)."""
    cli = importlib.import_module(f"{tool}.cli")
    paths: list[tuple[str, ...]] = [(tool,)]

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    paths.append((*prefix, choice.dest))
                    walk(action.choices[choice.dest], (*prefix, choice.dest))

    walk(cli.build_parser(), (tool,))
    return paths


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"help_startup: {' '.join(argv)} failed ({done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--all", action="store_true", help="every command and sub-command")
    a = ap.parse_args(argv)
    tools = [t for t in ("uqvision", "uqreg") if importlib.util.find_spec(t) is not None]
    for t in {"uqvision", "uqreg"} - set(tools):
        print(f"help_startup: {t} is not installed in {sys.executable}: left out")
    if importlib.util.find_spec("torch") is None:
        print(f"help_startup: torch is not installed in {sys.executable}: nothing to compare")
        return 0
    helps = ([p for t in tools for p in _every(t)] if a.all
             else [p for p in DEFAULT if p[0] in tools])
    sides = {"python -c 'import torch'": [sys.executable, "-c", "import torch"]}
    sides.update({f"{' '.join(p)} --help": [sys.executable, "-m", *p, "--help"] for p in helps})
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(a.rounds):  # interleaved: each round runs every side once
        for name, command in sides.items():
            times[name].append(_seconds(command))
    median = {name: statistics.median(t) for name, t in times.items()}
    torch_s = median["python -c 'import torch'"]
    width = max(map(len, sides))
    print(f"help_startup: median of {a.rounds} interleaved rounds, seconds and ratio to "
          f"python -c 'import torch' ({sys.executable})")
    for name, seconds in median.items():
        print(f"  {name:<{width}}  {seconds:6.2f} s  {seconds / torch_s:5.2f}x")
    worst = max((s, n) for n, s in median.items() if n.endswith("--help"))
    print(f"RESULT help_startup worst={worst[0]:.2f} worst_ratio={worst[0] / torch_s:.2f} "
          f"({worst[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
