#!/usr/bin/env bash
# GPU smoke check (run on the device machine): cuda single, 2x cuda via Gloo staging, mixed cuda+cpu.
set -u
T=$(python -c 'import torch,os;print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH=$T/lib
B=trainer-image/.gpu/heterotrain-trainer
nvidia-smi --query-gpu=name --format=csv,noheader
A="--model simple_cnn --synthetic-samples 2048 --batch-size 64 --max-steps 30 --epochs 100 --lr 0.05 --threads 4"
$B train $A --device cuda --output-dir $OUT/single 2>&1 | tail -2; echo "single rc=$?"
for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_PORT=29700 $B train $A --device cuda --backend auto --output-dir $OUT/two > $OUT/two.$r.log 2>&1 & done; wait
tail -2 $OUT/two.*.log
for r in 0 1; do D=cuda; [ $r = 1 ] && D=cpu; RANK=$r WORLD_SIZE=2 MASTER_PORT=29701 $B train $A --device $D --output-dir $OUT/mixed > $OUT/mixed.$r.log 2>&1 & done; wait
tail -2 $OUT/mixed.*.log
python - <<'PY'
import json, os
from safetensors.torch import load_file
o = os.environ["OUT"]
for run in ["single", "two", "mixed"]:
    st = [json.loads(l) for l in open(f"{o}/{run}/rank-0.jsonl") if '"step"' in l]
    print(run, "steps", len(st), "loss first/last %.4f %.4f" % (st[0]["global_loss"], st[-1]["global_loss"]),
          "median step s %.4f" % sorted(s["step_seconds"] for s in st)[len(st)//2])
a = load_file(f"{o}/single/model.safetensors")
for run in ["two", "mixed"]:
    b = load_file(f"{o}/{run}/model.safetensors")
    print(run, "max |d| vs single:", max((a[k] - b[k]).abs().max().item() for k in a))
PY
