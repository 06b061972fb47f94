# The cluster image: CUDA runtime, torch, DeepSpeed, vLLM and ggpo-batch (train + gpu extras),
# installed from the wheel `pip wheel .` builds: the same wheel tests/test_wheel.py checks outside the
# checkout, so the image holds the installed package and its data (migrations, profiles, suites),
# not the source. tools/check/dockerfile.py checks this file and runs its pip steps in a fresh venv
# without a container daemon.
#   docker build -t ggpo-batch .
#   docker run --rm ggpo-batch status                    # the entry point is ggpo-batch
#   docker run --rm --gpus 1 --entrypoint bash ggpo-batch /opt/ggpo-batch/tools/gpu_smoke.sh python
# An image cannot know its own digest: whoever starts the workers sets GGPO_IMAGE_DIGEST=sha256:... (as the
# registry, pyxis or apptainer names the image); the allocation inherits it and each attempt's provenance
# records it (ggpo_batch/contracts/provenance.py), so `report` can warn when runs ran in different images.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS base
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    DS_BUILD_OPS=0 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv && pip install --upgrade pip

# The wheel, in a stage of its own: the checkout (see .dockerignore) never reaches the final image.
FROM base AS wheel
COPY . /src
RUN pip wheel /src --no-deps -w /wheels

FROM base
# Heavy, rarely-changing layers first. vLLM is pinned to the release built against torch 2.13.0, the
# torch the train extra pins (vllm 0.33 moved to torch 2.14).
RUN pip install torch==2.13.0 deepspeed==0.19.8 vllm==0.32.0
COPY --from=wheel /wheels /wheels
RUN pip install "$(ls /wheels/ggpo_batch-*.whl)[train,gpu]"
# The GPU smoke check (tools/gpu_smoke.sh) is a checkout script: its files, without the rest.
COPY tools/gpu_smoke.sh /opt/ggpo-batch/tools/gpu_smoke.sh
COPY tools/gpu /opt/ggpo-batch/tools/gpu

# Not root. Slurm's container plugins (pyxis/enroot, apptainer) run the image as the submitting
# user anyway; under docker this is the user, with a home for ~/.config/ggpo-batch and the data dir.
RUN useradd --create-home --uid 10001 --shell /bin/bash ggpo
USER ggpo
WORKDIR /home/ggpo
# The package's files are where it reads them and work: migrations upgrade a throwaway SQLite
# ledger, profiles, suite and examples load, the starter spec passes preflight (ggpo_batch/smoke.py).
HEALTHCHECK --interval=10m --timeout=2m --start-period=30s CMD ["python", "-m", "ggpo_batch.smoke"]
ENTRYPOINT ["ggpo-batch"]
CMD ["--help"]
