#!/usr/bin/env bash
# GPU smoke test of the DeepSpeed path (one GPU, nccl): for ZeRO-2 and ZeRO-3, the tiny random Llama (built
# from a config, nothing downloaded) on the toy counter env with the HF rollout backend:
#   1. one process trains 1 RL step and checkpoints it;
#   2. `--resume auto` continues to step 2 and checkpoints again (DeepSpeed's collective save/load);
#   3. the exported `model/` of step 2 loads with plain transformers on the GPU, and its log-probs of a probe
#      sequence match the DeepSpeed engine's (recorded by the run) within 1e-3 (TF32/cuBLAS differences).
# Prints one table row per stage; exits non-zero if any check fails.
#
#   benchmarks/gpu_smoke.sh                 # uses .venv/bin/python (or $PYTHON)
#   OUT=/tmp/smoke benchmarks/gpu_smoke.sh  # keep the run folders
#   SMOKE_DEVICE=cpu benchmarks/gpu_smoke.sh  # the same flow on the CPU (gloo): checks the script itself
#
# Not run in this project's CI (no GPU there). It needs the package installed with torch for CUDA and
# DeepSpeed (`pip install -e ".[train]"`); vLLM is not needed (rollout.backend=hf).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TORCHRUN=${TORCHRUN:-$(dirname "$PYTHON")/torchrun}
OUT=${OUT:-$(mktemp -d -t gpu_smoke.XXXXXX)}
mkdir -p "$OUT"
DEVICE=${SMOKE_DEVICE:-cuda}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false SMOKE_DEVICE="$DEVICE"
if [ "$DEVICE" = cuda ]; then
  unset DS_ACCELERATOR  # DeepSpeed detects CUDA itself
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this is the GPU smoke test')"
else
  export DS_ACCELERATOR=cpu
fi

LAUNCH="$OUT/launch.py"
cat >"$LAUNCH" <<'EOF'
# Registers the test suite's toy env and skills, records the engine's probe log-probs at the end, runs the CLI.
import sys
from pathlib import Path
root = Path.cwd()
sys.path.insert(0, str(root / "tests"))
from toy_envs import register_toy_envs
from agentgym_opsd.registry import register_skill_library
register_toy_envs()
register_skill_library("toy", root / "tests" / "data" / "skills_small", override=True)
import torch
from agentgym_opsd.trainer.loop import Trainer
train = Trainer.train
def probed(self):
    lines = train(self)
    self.model.eval()
    with self.engine.full_weights():
        logp = self._logprobs(self.model, [[1, 2, 3, 4, 5, 6]], [[7, 8, 9, 10]])[0]
    if self.is_main:
        torch.save(logp.cpu(), self.out / "probe_logprobs.pt")
    return lines
Trainer.train = probed
from agentgym_opsd.trainer.cli import main
raise SystemExit(main(sys.argv[1:]))
EOF

CHECK="$OUT/check_export.py"
cat >"$CHECK" <<'EOF'
import os
import sys
import torch
from transformers import AutoModelForCausalLM
run, device = sys.argv[1], os.environ["SMOKE_DEVICE"]
model = AutoModelForCausalLM.from_pretrained(f"{run}/checkpoints/step_000002/model").to(device).eval()
ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], device=device)
with torch.no_grad():
    logits = model(input_ids=ids).logits[0, 5:-1].float()
mine = torch.log_softmax(logits, -1).gather(-1, ids[0, 6:, None])[:, 0].cpu()
theirs = torch.load(f"{run}/probe_logprobs.pt").float()
diff = float((mine - theirs).abs().max())
print(f"{sum(p.numel() for p in model.parameters())} {diff:.2e}")
sys.exit(0 if diff < 1e-3 else 1)
EOF

COMMON=(--config cpu-tiny env.id=ToyCounter-v0 "trainer.device=$DEVICE" trainer.save_every=1 trainer.tensorboard=false
        rollout.max_new_tokens=16)
printf '%-6s %-10s %-12s %-12s %-10s %-10s %-12s %-10s\n' stage step1_s resume_s loss_step2 grad_norm params logp_diff result
status=0
for zero in 2 3; do
  run="$OUT/zero$zero"
  t0=$(date +%s.%N)
  "$TORCHRUN" --standalone --nproc-per-node 1 "$LAUNCH" "${COMMON[@]}" deepspeed.zero_stage=$zero \
    trainer.total_steps=1 "trainer.output_dir=$run" >"$run.step1.log" 2>&1 || { echo "ZeRO-$zero step 1 failed: $run.step1.log"; status=1; continue; }
  t1=$(date +%s.%N)
  "$TORCHRUN" --standalone --nproc-per-node 1 "$LAUNCH" "${COMMON[@]}" deepspeed.zero_stage=$zero \
    trainer.total_steps=2 "trainer.output_dir=$run" --resume auto >"$run.resume.log" 2>&1 || { echo "ZeRO-$zero resume failed: $run.resume.log"; status=1; continue; }
  t2=$(date +%s.%N)
  read -r loss grad < <("$PYTHON" -c "import json,sys; m=[json.loads(x) for x in open(sys.argv[1])]; assert [x['step'] for x in m]==[1,2]; print(f\"{m[-1]['loss']:.5f} {m[-1]['grad_norm']:.3e}\")" "$run/metrics.jsonl")
  if out=$("$PYTHON" "$CHECK" "$run" 2>"$run.export.log"); then result=ok; else result=FAIL; status=1; fi
  read -r params diff <<<"${out:-? ?}"
  printf '%-6s %-10.1f %-12.1f %-12s %-10s %-10s %-12s %-10s\n' "ZeRO-$zero" "$(awk "BEGIN{print $t1 - $t0}")" \
    "$(awk "BEGIN{print $t2 - $t1}")" "$loss" "$grad" "$params" "$diff" "$result"
done
echo "device: $DEVICE; run folders: $OUT"
exit $status
