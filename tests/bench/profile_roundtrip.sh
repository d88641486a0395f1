#!/bin/bash
# profile_roundtrip.sh — a job's measured profile (<output_dir>/profile.json) replayed by roundpipe-sim vs the
# job's own measured iteration time after its partition was planned (CPU backend, cpu:2, sync;
# a benchmark: it prints the two and their ratio, never fails on them).
#   bash tests/bench/profile_roundtrip.sh
set -e
B="${RP_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build}"
W=$(mktemp -d /tmp/rt.XXXX); mkdir -p $W/data
python3 -c "
import random; random.seed(1)
import struct
open('$W/data/tok.bin','wb').write(struct.pack('<%dH'%400000, *[random.randrange(2048) for _ in range(400000)]))"
$B/server/roundpiped --state_dir $W/state --listen 127.0.0.1:0 --metrics_address 127.0.0.1:0 --devices cpu:2 --allowed_root $W/data --ready_file $W/ready.json > $W/d.log 2>&1 &
P=$!
for i in $(seq 100); do [ -f $W/ready.json ] && break; sleep 0.1; done
A=$(sed -E 's/.*"grpc": \["([^"]+)".*/\1/' $W/ready.json)
cat > $W/job.json <<JSON
{"name": "rt", "model": {"family": "llama", "vocab": 2048, "hidden": 256, "intermediate": 688, "numBlocks": 6,
 "numHeads": 4, "numKvHeads": 2, "headDim": 64, "initSeed": 1},
 "precision": "PRECISION_FP32", "optimizer": {"lr": 0.001, "mode": "OPTIMIZER_MODE_SYNC"},
 "batching": {"globalBatch": 8, "microBatch": 2, "sequenceLength": 128},
 "data": {"tokenFile": {"path": "$W/data/tok.bin"}}, "maxSteps": 40, "outputDir": "$W/data/out"}
JSON
J=$($B/client/roundpipe --address $A submit $W/job.json)
$B/client/roundpipe --address $A watch $J > $W/watch.txt
$B/client/roundpipe --address $A get --json $J > $W/job.txt
PART=$(python3 -c "import json; print(json.load(open('$W/job.txt'))['partition'])")
echo "partition: $PART"
ARG=$(python3 -c "
import re; m=re.match(r'F\[([0-9,]*)\] B1=([0-9]+) B\[([0-9,]*)\]', '$PART')
print(';'.join(x for x in [('F='+m[1]) if m[1] else '', 'B1='+m[2], ('B='+m[3]) if m[3] else ''] if x))")
$B/scheduler/roundpipe-sim --profile $W/data/out/profile.json --gpus 2 --microbatches 4 --schedule roundpipe-sync --format json --partition "$ARG" > $W/sim.json
grep -E "step (20|30|40)/" $W/watch.txt
python3 - <<PY
import json,re
sim=json.load(open('$W/sim.json'))[0]
vals=[]
for l in open('$W/watch.txt'):
    m=re.search(r'step (\d+)/40 .*tokens/s ([0-9.]+)', l)
    if m and int(m.group(1))>=20: vals.append(8*128/float(m.group(2)))
vals.sort()
meas=vals[len(vals)//2]
print(f"simulated iteration {sim['iteration_s']:.4f} s, measured median {meas:.4f} s (steps 20-40, {len(vals)} samples), ratio {meas/sim['iteration_s']:.2f}")
PY
kill $P; wait $P 2>/dev/null || true
