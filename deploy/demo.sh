#!/usr/bin/env bash
# demo.sh — the main job: install, build, then run the schedule simulator on the paper's models
# (§5.8.1 experiment) and show one RoundPipe schedule as a Gantt chart.
# (The daemon demo replaces this once roundpiped exists.)
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$RP_ROOT/deploy/build.sh"
SIM="$RP_BUILD_DIR/scheduler/roundpipe-sim"
echo
"$SIM" --paper
echo
"$SIM" --model llama-3.1-8b --device rtx4090 --gpus 8 --microbatches 16 --schedule all \
  --gantt --gantt_width 110 --iterations 2
