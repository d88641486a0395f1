#!/usr/bin/env bash
# demo.sh — the main job: install, build, then run the schedule simulator on the paper's models
# (§5.8.1 experiment) and show one RoundPipe schedule as a Gantt chart.
# Then a short real training run on two CPU devices through the engine (roundpipe-train).
# (The daemon demo replaces both once roundpiped exists.)
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$RP_ROOT/deploy/build.sh"
SIM="$RP_BUILD_DIR/scheduler/roundpipe-sim"
echo
"$SIM" --paper
echo
"$SIM" --model llama-3.1-8b --device rtx4090 --gpus 8 --microbatches 16 --schedule all \
  --gantt --gantt_width 110 --iterations 2
echo
# A real (CPU) training run through the engine: staleness-1 async optimizer, automatic
# partitioning, bf16 master copies, two CPU devices.
"$RP_BUILD_DIR/scheduler/roundpipe-train" --devices cpu:2 --mode async --precision bf16 --steps 100
