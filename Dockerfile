# The cluster image: CUDA runtime, torch, DeepSpeed, vLLM and ggpo-batch (train + gpu extras).
# torch's CUDA libraries come from its wheels; the base image brings the CUDA runtime/driver glue.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    DS_BUILD_OPS=0 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv && pip install --upgrade pip

WORKDIR /opt/ggpo-batch
# Heavy, rarely-changing layers first. vLLM is pinned to the release built against torch 2.13.0, the
# torch the train extra pins (vllm 0.33 moved to torch 2.14).
RUN pip install torch==2.13.0 deepspeed==0.19.8 vllm==0.32.0

# The whole checkout (see .dockerignore): the ledger's migrations/, jobs/ and slurm/ profiles are
# read from it, so the package is installed editable in place.
COPY . .
RUN pip install -e ".[train,gpu]"

# A smoke check of the image on a GPU node: docker run --gpus 1 IMAGE bash tools/gpu_smoke.sh
ENTRYPOINT ["ggpo-batch"]
CMD ["--help"]
