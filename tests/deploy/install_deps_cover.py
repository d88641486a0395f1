#!/usr/bin/env python3
"""Check that deploy/install-deps.sh installs everything a build and its tests used.

A machine that already carries a CUDA toolkit, clang's sanitizer runtime or other extras builds
and tests green even when install-deps.sh forgets them; a fresh Debian 12 machine does not. This
check reads what the build really used and traces every file to where it came from:

  * every header a compile read (`ninja -t deps` of each build directory given),
  * every library given to a link by path or by -l name (build.ninja's LINK_LIBRARIES),
  * the compilers of each build (CMakeCache.txt) and the programs the build and the tests call
    by name (protoc, grpc_cpp_plugin, openssl, ...), looked up as a fresh machine would find
    them (/usr/bin, /bin), and the Python modules the tests import from Debian's python3.

A file passes when it lies under an allowed prefix (the checkout, the build directories,
install-deps' own prefix) or when dpkg says a package owns it that a bare `debootstrap
--variant=minbase` system has (Priority required, or apt) or that install-deps' package list
pulls in through Depends/PreDepends (Recommends are not installed: install-deps passes
--no-install-recommends). Anything else fails, naming the file and, where dpkg knows it, the
package to add. Exit status: 0 covered, 1 not covered, 2 usage or environment error.

Usage: install_deps_cover.py --source DIR --prefix DIR --build DIR [--build DIR ...]
                             [--build-if-present DIR ...]
                             [--packages "p1 p2" | --install-deps SCRIPT] [--file PATH ...]
       (--file: check these paths as well; with no --build, only these — the self-test's mode)
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

# Programs the build or the tests run by name (not by an absolute path a build file records).
PROGRAMS = ["cmake", "ninja", "ccache", "pkg-config", "protoc", "grpc_cpp_plugin",
            "grpc_python_plugin", "git", "clang-format", "clang++", "openssl", "python3",
            "mkfifo", "timeout"]
# Modules the tests import from Debian's /usr/bin/python3 (the venv's come from PyPI).
PYTHON_MODULES = ["grpc", "google.protobuf"]


def die(msg):
    print(f"install_deps_cover: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def dpkg_owners():
    """path -> package, from dpkg's file lists (one pass; `dpkg -S` per file is far too slow)."""
    owners = {}
    for lst in glob.glob("/var/lib/dpkg/info/*.list"):
        pkg = os.path.basename(lst)[: -len(".list")].split(":")[0]
        with open(lst, errors="replace") as f:
            for line in f:
                owners.setdefault(line.rstrip("\n"), pkg)
    return owners


def allowed_packages(listed):
    """Packages a minbase system has, plus the Depends/PreDepends closure of `listed`."""
    base = {"apt"}
    for line in run(["dpkg-query", "-W", "-f", "${Package} ${Priority} ${Essential}\n"]).splitlines():
        name, prio, essential = (line.split() + ["", "", ""])[:3]
        if prio == "required" or essential == "yes":
            base.add(name)
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + listed)
    closure = set()
    for line in out.splitlines():
        if line and not line[0].isspace():
            closure.add(line.strip().strip("<>").split(":")[0])
        else:  # "  Depends: name", "  |Depends: name", or a provider under a virtual ("    name")
            name = line.split(":", 1)[1] if ":" in line else line
            closure.add(name.strip().strip("<>").split(":")[0])
    return base | closure


def candidates(path):
    """The path, its resolved form, and their merged-/usr twins (dpkg lists either spelling)."""
    out = []
    for p in (os.path.normpath(path), os.path.realpath(path)):
        out.append(p)
        for a, b in (("/usr/lib/", "/lib/"), ("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/"),
                     ("/usr/lib64/", "/lib64/")):
            if p.startswith(a):
                out.append(b + p[len(a):])
            elif p.startswith(b):
                out.append(a + p[len(b):])
    return list(dict.fromkeys(out))


def ninja_deps(build):
    """Headers (and other implicit inputs) each compile in `build` read, from ninja's log."""
    out = run(["ninja", "-C", build, "-t", "deps"])
    files = set()
    for line in out.splitlines():
        if line.startswith("    "):
            p = line.strip()
            files.add(p if os.path.isabs(p) else os.path.join(build, p))
    return files


LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib", "/lib"]


def link_inputs(build):
    """Libraries each link in `build` names: absolute paths, and -lNAME resolved as ld would."""
    files = set()
    text = open(os.path.join(build, "build.ninja"), errors="replace").read()
    for m in re.finditer(r"^\s*LINK_LIBRARIES = (.*)$", text, re.M):
        for tok in shlex.split(m.group(1)):
            for part in tok.split(","):  # -Wl,--no-as-needed,/path/lib.so,--as-needed
                if part.startswith("/") and os.path.exists(part):
                    files.add(part)
                elif part.startswith("-l") and len(part) > 2:
                    for d in LIB_DIRS:
                        hit = [os.path.join(d, f"lib{part[2:]}{s}") for s in (".so", ".a")]
                        hit = [h for h in hit if os.path.exists(h)]
                        if hit:
                            files.add(hit[0])
                            break
    return files


def compilers(build):
    files = set()
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        for line in open(cache, errors="replace"):
            m = re.match(r"CMAKE_(CXX|C)_COMPILER(_LAUNCHER)?:\w+=(/\S+)$", line.strip())
            if m:
                files.add(m.group(3))
    return files


def programs():
    files = set()
    for name in PROGRAMS:
        for d in ("/usr/bin", "/bin"):
            p = os.path.join(d, name)
            if os.path.exists(p):
                files.add(p)
                break
        else:
            files.add(os.path.join("/usr/bin", name))  # reported as missing below
    for mod in PYTHON_MODULES:
        try:
            f = run(["/usr/bin/python3", "-c", f"import {mod} as m; print(m.__file__)"]).strip()
            files.add(f)
        except (subprocess.CalledProcessError, FileNotFoundError):
            files.add(f"/usr/bin/python3 (module {mod})")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--prefix", required=True, help="install-deps' RP_PREFIX")
    ap.add_argument("--build", action="append", default=[])
    ap.add_argument("--build-if-present", action="append", default=[],
                    help="like --build, skipped when it holds no build.ninja yet")
    ap.add_argument("--packages", help="space-separated list (default: ask --install-deps)")
    ap.add_argument("--install-deps", help="path of deploy/install-deps.sh")
    ap.add_argument("--file", action="append", default=[])
    a = ap.parse_args()

    if a.packages is not None:
        listed = a.packages.split()
    elif a.install_deps:
        listed = run(["bash", a.install_deps, "--print-packages"]).split()
    else:
        die("give --packages or --install-deps")
    a.build += [b for b in a.build_if_present if os.path.exists(os.path.join(b, "build.ninja"))]
    prefixes = [os.path.realpath(p) + "/" for p in [a.source, a.prefix] + a.build]

    used = set(a.file)
    for b in a.build:
        if not os.path.exists(os.path.join(b, "build.ninja")):
            die(f"{b} is not a ninja build directory (build first)")
        used |= ninja_deps(b) | link_inputs(b) | compilers(b)
    if a.build:
        used |= programs()

    owners = dpkg_owners()
    allowed = allowed_packages(listed)
    problems = []
    for f in sorted(used):
        if not f.startswith("/") or not os.path.exists(f):
            problems.append(f"{f}: missing on this machine")
            continue
        cands = candidates(f)
        if any((c + "/").startswith(p) or c.startswith(p) for c in cands for p in prefixes):
            continue
        pkgs = [owners[c] for c in cands if c in owners]
        if any(p in allowed for p in pkgs):
            continue
        if pkgs:
            problems.append(f"{f}: from Debian package {pkgs[0]}, which install-deps.sh does not install")
        else:
            problems.append(f"{f}: no Debian package owns it and it is outside {', '.join(prefixes)}")
    checked = len(used)
    if problems:
        print(f"install-deps.sh does not cover {len(problems)} of {checked} files the build used:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"install-deps.sh covers all {checked} files the build used "
          f"({len(listed)} listed packages, {len(allowed)} with dependencies and the base system)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
