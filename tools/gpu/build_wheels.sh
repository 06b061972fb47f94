#!/bin/sh
# The wheels tools/gpu/flagship_check.py needs on the lent GPU machine beyond its own torch and
# transformers: DeepSpeed and what DeepSpeed imports, the compiled ones for every CPython the device
# may run (3.10-3.13). DeepSpeed comes as a source release: built here into a pure-Python wheel (its
# ops are compiled at run time, and none is: the trainer's optimizer is torch's AdamW); the rest are
# PyPI's wheels. About 15 MiB: the device tool carries 64 MiB at most.
# Usage: tools/gpu/build_wheels.sh [FOLDER] (default .whl, which git ignores).
set -eu
out=${1:-.whl}
pip=${PIP:-.venv/bin/python -m pip}
mkdir -p "$out"
# The versions of this checkout's venv (pydantic and pydantic-core must match each other exactly).
$pip wheel --quiet --no-deps --no-build-isolation -w "$out" deepspeed==0.19.8  # its setup.py imports torch
$pip download --quiet --no-deps --only-binary=:all: -d "$out" hjson==3.1.0 py-cpuinfo==9.0.0 \
    einops==0.8.2 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
for v in 3.10 3.11 3.12 3.13; do
    $pip download --quiet --no-deps --only-binary=:all: --python-version "$v" --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$out" pydantic-core==2.50.5 msgpack==1.2.4 psutil==7.2.2
done
du -sh "$out"
