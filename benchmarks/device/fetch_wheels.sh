#!/usr/bin/env bash
# Download, here, the CPython 3.12 x86-64 wheels that the device machine lacks (wheels.txt) into
# .whl/ at the repository root (git-ignored), for the device tool to carry (`carry: [".whl"]`).
# No dependencies are resolved: wheels.txt names every missing one.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
grep -v '^#' benchmarks/device/wheels.txt | grep . | while read -r requirement; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .whl "$requirement"
done
ls -la .whl
du -sh .whl
