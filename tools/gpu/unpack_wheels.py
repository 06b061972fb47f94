"""Unpack the wheels in FOLDER that fit this Python into TARGET, without pip or a network: for the
lent GPU machine, which gets DeepSpeed and its requirements as carried wheels (build_wheels.sh).
A wheel is a zip of its package's files; a pure-Python one or one built for this CPython (or for
the stable ABI) is installed by unpacking it onto sys.path. Usage:

    python tools/gpu/unpack_wheels.py .whl /tmp/ds && PYTHONPATH=/tmp/ds python tools/gpu/flagship_check.py
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def fits(wheel: str, version: tuple[int, int] = sys.version_info[:2]) -> bool:
    """Whether the wheel file name's Python and ABI tags fit CPython `version` (linux x86_64 assumed)."""
    python, abi = wheel.removesuffix(".whl").split("-")[-3:-1]
    here = f"cp{version[0]}{version[1]}"
    if abi == "none":
        return any(t in ("py3", f"py{version[0]}{version[1]}", here) for t in python.split("."))
    if abi == "abi3":  # the stable ABI: built for cp3X, runs on every CPython from 3.X on
        return any(t.startswith("cp3") and int(t[3:]) <= version[1] for t in python.split("."))
    return here in abi.split(".")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder, target = Path(argv[0]), Path(argv[1])
    wheels = sorted(w for w in folder.glob("*.whl") if fits(w.name))
    if not wheels:
        print(f"error: no wheel in {folder} fits Python {sys.version.split()[0]}", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(target)
    print(f"unpacked {len(wheels)} wheels into {target}: {', '.join(w.name.split('-')[0] for w in wheels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
