"""Check the Dockerfile without a container daemon (this machine has none).

    python tools/check/dockerfile.py [--static] [--python PY] [--keep DIR] [DOCKERFILE]

Static checks (always; a few milliseconds): the image is built from the package's wheel (a
`pip wheel` step, a `.whl` installed in the final stage, no editable install, no `COPY .` of the
checkout into the final stage), runs as a user that is not root, and has a HEALTHCHECK.

Then, unless --static, the Dockerfile's own steps run on this machine in a fresh folder ROOT, in file
order: every absolute path they name is taken under ROOT (/opt/venv -> ROOT/opt/venv); ENV and WORKDIR
apply; COPY copies from the build context (the checkout's tracked and untracked-not-ignored files,
less what .dockerignore names); of each RUN only the parts that create a venv or call pip run (apt-get,
useradd, rm change this machine, not a folder: each skipped part is printed). vLLM is left out, its
wheels being CUDA builds: `vllm` requirements and the extras that only bring vLLM (setup.cfg) are
dropped, and said so. Then, as the image would: the package must import from ROOT's venv, not from
the checkout; the HEALTHCHECK command and ENTRYPOINT + CMD must exit 0.
It downloads what the Dockerfile's pip commands download (minutes the first time).
Exit 0: every check passed; 1: a check or a step failed; 2: the Dockerfile cannot be read.
"""

from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CUDA_ONLY = frozenset({"vllm"})  # requirements whose wheels are CUDA builds: not installed here
ROOT_USERS = frozenset({"root", "0", "root:root", "0:0"})
# the environment of this process that must not reach the image's commands
HOST_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "XDG_CONFIG_HOME", "XDG_DATA_HOME")


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str
    stage: int


def parse(text: str) -> list[Instruction]:
    """The instructions, continuation lines joined and comments dropped, with their stage (FROM count)."""
    out: list[Instruction] = []
    stage, start, parts = -1, 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not parts and (not line or line.startswith("#")):
            continue
        if parts and line.startswith("#"):
            continue
        if not parts:
            start = number
        parts.append(line[:-1].strip() if line.endswith("\\") else line)
        if line.endswith("\\"):
            continue
        keyword, _, args = " ".join(p for p in parts if p).partition(" ")
        parts = []
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(start, keyword.upper(), args.strip(), stage))
    return out


def run_parts(args: str) -> list[str]:
    """A RUN's shell command split at `&&` (the Dockerfile's own style; no `&&` inside quotes)."""
    return [p.strip() for p in args.split("&&") if p.strip()]


def _is_pip(part: str) -> bool:
    return bool(re.match(r"^(\S*/)?(pip3?|python3?(\.\d+)? -m pip)\s", part))


def _is_venv(part: str) -> bool:
    return bool(re.match(r"^(\S*/)?python3?(\.\d+)? -m venv\s", part))


def problems(instructions: list[Instruction]) -> list[str]:
    """What makes the image not the wheel's install, run as root, or without a health check."""
    found: list[str] = []
    last = max((i.stage for i in instructions), default=-1)
    final = [i for i in instructions if i.stage == last]
    pip_runs = [(i, p) for i in instructions if i.keyword == "RUN" for p in run_parts(i.args) if _is_pip(p)]
    for i, part in pip_runs:
        if re.search(r"\binstall\b.*(\s-e\s|\s-e$|--editable)", part):
            found.append(f"line {i.line}: an editable install ({part}): the image must hold the wheel's install")
    if not any(re.search(r"\bwheel\b", p) for _i, p in pip_runs):
        found.append("no `pip wheel` step: the image must be built from the package's wheel")
    if not any(i.stage == last and re.search(r"\binstall\b", p) and ".whl" in p for i, p in pip_runs):
        found.append("the final stage installs no .whl: the package must come from the wheel")
    for i in final:
        if i.keyword == "COPY" and not i.args.startswith("--from") and shlex.split(i.args)[0] in (".", "./"):
            found.append(f"line {i.line}: the final stage copies the whole checkout (COPY {i.args})")
    users = [i for i in final if i.keyword == "USER"]
    if not users:
        found.append("no USER in the final stage: the image would run as root")
    elif users[-1].args.split()[0] in ROOT_USERS:
        found.append(f"line {users[-1].line}: USER {users[-1].args}: the image must not run as root")
    checks = [i for i in final if i.keyword == "HEALTHCHECK"]
    if not checks or checks[-1].args.upper().startswith("NONE") or " CMD " not in f" {checks[-1].args} ":
        found.append("no HEALTHCHECK ... CMD in the final stage")
    return found


def cuda_only_extras(setup_cfg: Path = REPO / "setup.cfg") -> frozenset[str]:
    """The extras of setup.cfg whose every requirement is a CUDA_ONLY package."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    out = set()
    for extra, value in cfg.items("options.extras_require") if cfg.has_section("options.extras_require") else []:
        names = {re.split(r"[\[=<>!~ ;]", r.strip(), maxsplit=1)[0].lower()
                 for r in value.splitlines() if r.strip() and not r.strip().startswith("#")}
        if names and names <= CUDA_ONLY:
            out.add(extra)
    return frozenset(out)


def without_cuda(part: str, extras: frozenset[str]) -> tuple[str, list[str]]:
    """A pip command without the CUDA_ONLY requirements and the extras that bring only them."""
    dropped: list[str] = []

    def requirement(m: re.Match[str]) -> str:
        dropped.append(m.group(2))
        return m.group(1)

    names = "|".join(sorted(CUDA_ONLY))
    part = re.sub(rf"(\s)((?:{names})(?:\[[^\]]*\])?(?:[=<>!~]=?[^\s\"']+)?)(?=\s|$)", requirement, part)

    def extra_list(m: re.Match[str]) -> str:
        kept = [e for e in m.group(1).split(",") if e not in extras]
        dropped.extend(f"the {e} extra" for e in m.group(1).split(",") if e in extras)
        return f"[{','.join(kept)}]" if kept else ""

    part = re.sub(r"\[([A-Za-z0-9_,-]+)\]", extra_list, part)
    return re.sub(r"\s+", " ", part).strip(), dropped


def under(root: Path, text: str) -> str:
    """Every absolute path in a shell string taken under `root` ($VAR references stay)."""
    return re.sub(r"(^|[\s\"'=:(])(/[^\s\"':;)]*)", lambda m: f"{m.group(1)}{root}{m.group(2)}", text)


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `rel` out: a pattern matches the path or a folder above it, from
    the context's root (`**/` at any depth); `*` here also crosses `/`, a little wider than docker's."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    for pattern in (p.strip("/") for p in patterns):
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(prefix.rsplit("/", 1)[-1], pattern[3:]):
                return True
    return False


def context_files(repo: Path = REPO) -> list[str]:
    """The build context: the checkout's tracked and untracked-not-ignored files, less .dockerignore."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    ignore = repo / ".dockerignore"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if ignore.is_file() else []
    return sorted(f for f in listed if f and (repo / f).is_file() and not _ignored(f, patterns))


def _copy(args: str, root: Path, cwd: Path, files: list[str]) -> str | None:
    """Do a COPY under `root`; what was done, or None when a source is not in the build context."""
    words = [w for w in shlex.split(args) if not w.startswith("--")]
    *sources, dest = words
    if args.startswith("--from"):  # another stage's files: every stage shares ROOT here
        return f"from another stage: {', '.join(sources)} (already under ROOT)"
    target = Path(under(root, dest)) if dest.startswith("/") else cwd / dest
    for src in (s.rstrip("/") or "." for s in sources):
        if src in (".", "./"):
            pairs = [(rel, target / rel) for rel in files]
        elif src in files:
            pairs = [(src, target / Path(src).name if dest.endswith("/") else target)]
        else:  # a folder: its contents go into dest
            pairs = [(rel, target / rel[len(src) + 1:]) for rel in files if rel.startswith(src + "/")]
        if not pairs:
            return None
        for rel, out in pairs:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, out)
    return f"copied {', '.join(sources)} -> {target}"


def _command(args: str) -> list[str]:
    """A CMD/ENTRYPOINT/HEALTHCHECK command: its JSON array, or a shell form."""
    args = args.strip()
    if args.startswith("["):
        return list(json.loads(args))
    return ["/bin/sh", "-c", args]


def _env_update(args: str, env: dict[str, str], root: Path) -> None:
    for word in shlex.split(args):
        key, _, value = word.partition("=")
        env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), under(root, value))


def run(instructions: list[Instruction], root: Path, python: str) -> int:
    """Execute the Dockerfile's venv and pip steps under `root`, then its health check and entry point."""
    env = {k: v for k, v in os.environ.items() if k not in HOST_ONLY_ENV and not k.startswith("GGPO_")}
    cwd, files, extras = root, context_files(), cuda_only_extras()
    healthcheck: list[str] = []
    entrypoint: list[str] = []
    cmd: list[str] = []
    for i in instructions:
        where = f"line {i.line:3d} {i.keyword}"
        if i.keyword == "ENV":
            _env_update(i.args, env, root)
        elif i.keyword == "WORKDIR":
            cwd = Path(under(root, i.args)) if i.args.startswith("/") else cwd / i.args
            cwd.mkdir(parents=True, exist_ok=True)
        elif i.keyword == "COPY":
            done_copy = _copy(i.args, root, cwd, files)
            if done_copy is None:
                print(f"FAIL {where}: a source of COPY {i.args} is not in the build context")
                return 1
            print(f"{where}: {done_copy}")
        elif i.keyword == "RUN":
            for part in run_parts(i.args):
                if not (_is_pip(part) or _is_venv(part)):
                    print(f"{where}: skipped (changes this machine, not a folder): {part}")
                    continue
                shell, dropped = without_cuda(part, extras) if _is_pip(part) else (part, [])
                shell = under(root, shell)
                if _is_venv(part):  # the image's python3: here the one given
                    shell = re.sub(r"^\S*python3?(\.\d+)?", lambda _m: shlex.quote(python), shell)
                for what in dropped:
                    print(f"{where}: left out {what}: vLLM's wheels are CUDA builds")
                print(f"{where}: $ {shell}", flush=True)
                t0 = time.monotonic()
                done = subprocess.run(["bash", "-c", shell], cwd=cwd, env=env, check=False)
                print(f"{where}: exit {done.returncode} in {time.monotonic() - t0:.1f} s", flush=True)
                if done.returncode != 0:
                    return 1
        elif i.keyword == "HEALTHCHECK":
            healthcheck = _command(i.args[i.args.upper().index("CMD") + 3:])
        elif i.keyword == "ENTRYPOINT":
            entrypoint = _command(i.args)
        elif i.keyword == "CMD":
            cmd = _command(i.args)
        elif i.keyword == "USER":
            print(f"{where}: {i.args} (the commands below run as this machine's user)")
    venv = Path(env.get("VIRTUAL_ENV", root / "opt" / "venv"))
    env["HOME"] = str(cwd)
    where = subprocess.run(["python", "-c", "import ggpo_batch; print(ggpo_batch.__file__)"], cwd=cwd, env=env,
                           capture_output=True, text=True, check=False)
    if where.returncode != 0 or not where.stdout.strip().startswith(str(venv)):
        print(f"FAIL: ggpo_batch does not import from {venv}: {where.stdout.strip()} {where.stderr.strip()[-500:]}")
        return 1
    print(f"ggpo_batch imports from {where.stdout.strip()}")
    for name, argv in (("HEALTHCHECK", healthcheck), ("ENTRYPOINT + CMD", entrypoint + cmd)):
        print(f"{name}: $ {shlex.join(argv)}", flush=True)
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        print("\n".join(f"  {ln}" for ln in (done.stdout + done.stderr).strip().splitlines()[-12:]))
        if done.returncode != 0:
            print(f"FAIL: {name} exited {done.returncode}")
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dockerfile", nargs="?", type=Path, default=REPO / "Dockerfile")
    ap.add_argument("--static", action="store_true", help="only the static checks and the plan; run nothing")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that makes the venv "
                    "(the image's python3; default: this one)")
    ap.add_argument("--keep", type=Path, help="run in this (new) folder and keep it, instead of a temporary one")
    args = ap.parse_args(argv)
    try:
        instructions = parse(args.dockerfile.read_text())
    except OSError as exc:
        print(f"error: {args.dockerfile}: cannot read ({exc.strerror})", file=sys.stderr)
        return 2
    found = problems(instructions)
    for p in found:
        print(f"problem: {args.dockerfile.name}: {p}")
    if found:
        return 1
    print(f"{args.dockerfile.name}: static checks passed (wheel built and installed, no editable install, "
          f"non-root USER, HEALTHCHECK)")
    extras = cuda_only_extras()
    for i in instructions:
        for part in run_parts(i.args) if i.keyword == "RUN" else []:
            kind = "run " if _is_pip(part) or _is_venv(part) else "skip"
            shown, dropped = without_cuda(part, extras) if _is_pip(part) else (part, [])
            print(f"plan: line {i.line:3d} {kind} {shown}" + (f"   (left out: {', '.join(dropped)})" if dropped else ""))
    if args.static:
        return 0
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        return run(instructions, args.keep.resolve(), args.python)
    with tempfile.TemporaryDirectory(prefix="ggpo-dockerfile-") as folder:
        return run(instructions, Path(folder), args.python)


if __name__ == "__main__":
    sys.exit(main())
