#!/usr/bin/env bash
# thread-safety.sh — clang's static lock analysis (-Wthread-safety, as errors) over every
# translation unit of server/ and every other one that annotates locked state (ABSL_GUARDED_BY
# & co. in the source or in one of our headers it includes, transitively), compiled with the flags CMake recorded
# for it (compile_commands.json of the build dir). Usage: deploy/thread-safety.sh [build-dir]
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-${RP_BUILD_DIR:-$RP_ROOT/build}}"
CLANG="$(command -v clang++ || command -v clang++-14 || true)"
if [ -z "$CLANG" ]; then
  echo "thread-safety: clang++ not found (deploy/install-deps.sh installs it)" >&2
  exit 1
fi
# The analysis must fire on a known violation first.
probe="$("$CLANG" -fsyntax-only -std=c++20 -Wthread-safety -Werror=thread-safety \
  "$RP_ROOT/tests/cmake/thread_safety/unguarded_read.cc" 2>&1 || true)"
if ! grep -q "requires holding mutex 'mu_'" <<<"$probe"; then
  echo "thread-safety: the analysis did not flag tests/cmake/thread_safety/unguarded_read.cc:" >&2
  echo "$probe" >&2
  exit 1
fi
python3 - "$BUILD/compile_commands.json" "$RP_ROOT" "$CLANG" <<'PY'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
db, root, clang = sys.argv[1], sys.argv[2], sys.argv[3]
annotated = re.compile(r'ABSL_(PT_)?GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED')
include = re.compile(r'^#include "([^"]+)"', re.M)
def wants(path):
    # server/ whole; elsewhere a source that annotates locked state itself or includes one of
    # our headers that does (a user of an annotated struct is checked as well as its owner).
    if not path.startswith(root + '/') or '/tests/' in path or '/build' in path:
        return False
    if path.startswith(root + '/server/'):
        return True
    return annotates(path, set())
def annotates(path, seen):  # the file or any of our headers it includes, transitively
    if path in seen or not os.path.exists(path):
        return False
    seen.add(path)
    text = open(path, encoding='utf-8').read()
    if annotated.search(text):
        return True
    return any(annotates(os.path.join(root, h), seen) for h in include.findall(text))
jobs = []
for e in json.load(open(db)):
    if not wants(e['file']):
        continue
    args = shlex.split(e['command'])[1:]
    out, i = [], 0
    while i < len(args):  # drop the output, the PCH (gcc's) and gcc-only flags
        a = args[i]
        if a in ('-o', '-MF', '-MT', '-MQ'):
            i += 2
            continue
        if a == '-include' and args[i + 1].endswith('cmake_pch.hxx'):
            i += 2
            continue
        if a in ('-c', '-MD', '-Winvalid-pch') or a.startswith('-fpch'):
            i += 1
            continue
        out.append(a)
        i += 1
    jobs.append((e['file'], [clang, '-fsyntax-only', '-Wthread-safety', '-Werror=thread-safety', '-Wno-unknown-warning-option'] + out))
def run(job):
    f, cmd = job
    r = subprocess.run(cmd, cwd=os.path.dirname(db), capture_output=True, text=True)
    return f, r.returncode, r.stderr
failed = 0
with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as ex:
    for f, rc, err in ex.map(run, jobs):
        if rc != 0:
            failed += 1
            sys.stderr.write(err)
print(f"thread-safety: {len(jobs)} translation units analysed, {failed} with errors")
sys.exit(1 if failed else 0)
PY
