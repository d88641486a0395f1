#!/usr/bin/env python3
"""Syntax-check the engine against another LibTorch's headers (e.g. the GPU machine's 2.11).

The GPU machine builds against its own PyTorch, older than the wheel CI uses; a C++ API we use
that is newer fails only there, where every minute counts. This compiles every engine
translation unit (workers/, scheduler/ minus planning, tests/gpu, tests/support, gpu_bench) with
-fsyntax-only, taking the flags from an existing build's compile_commands.json and swapping the
torch include directory. Getting the headers needs no GPU and no install:

  pip download torch==2.11.0 --no-deps -d /tmp/t && cd /tmp/t && unzip -q torch-*.whl 'torch/include/*'
  python3 tests/gpu/check_torch_headers.py --build build --include /tmp/t/torch/include
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build dir with compile_commands.json")
    ap.add_argument("--include", required=True, help="the other LibTorch's include directory")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    commands = json.load(open(os.path.join(a.build, "compile_commands.json")))
    ours = os.path.join(os.path.abspath(a.build), "torch-include")  # RoundpipeTorch's filtered copy
    pattern = re.compile(r"/(workers|scheduler|tests/gpu|tests/support)/.*\.cc$|/tests/bench/gpu_bench\.cc$")
    todo = [e for e in commands if pattern.search(e["file"]) and "/planning/" not in e["file"]]
    running, failed = [], []

    def reap(block):
        while running and (block or len(running) >= a.jobs):
            f, p = running.pop(0)
            out = p.communicate()[0].decode(errors="replace")
            if p.returncode:
                failed.append(f)
                print(f"FAIL {f}\n{out[:4000]}")

    for e in todo:
        args, skip = [], False
        for x in shlex.split(e["command"]):
            if skip:
                skip = False
                continue
            if x in ("-o", "-include"):  # drop the object file and the precompiled header
                skip = True
                continue
            if x == "-c" or x.endswith("ccache"):
                continue
            args.append(x.replace(ours, a.include))
        running.append((e["file"], subprocess.Popen(args + ["-fsyntax-only", "-w"], cwd=e["directory"],
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        reap(False)
    reap(True)
    print(f"{len(todo) - len(failed)}/{len(todo)} translation units compile against {a.include}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
