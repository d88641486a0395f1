#!/usr/bin/env python3
"""ctest_report.py — the end of the test command: what ran, what skipped, where the minutes went.

    ctest_report.py JUNIT_XML BUILD_DIR [--slowest N]

Reads CTest's JUnit file (ctest --output-junit) and the tests' labels (ctest --show-only=json-v1
in BUILD_DIR), prints per label the number of tests, failures, skips and summed seconds, then the
N slowest tests. Exits 1 when any test without the `gpu` label was skipped: a skip is not a pass,
and only GPU tests may skip (on machines without a GPU). Standard library only.
"""
import argparse
import collections
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

ALLOWED_SKIP_LABEL = "gpu"


def labels_by_test(build_dir):
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True, capture_output=True, text=True)
    out = {}
    for test in json.loads(shown.stdout).get("tests", []):
        labels = []
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                labels = list(prop.get("value") or [])
        out[test["name"]] = labels or ["(none)"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit")
    ap.add_argument("build_dir")
    ap.add_argument("--slowest", type=int, default=25)
    args = ap.parse_args()
    labels = labels_by_test(args.build_dir)
    cases = []
    for case in ET.parse(args.junit).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("skipped") is not None or case.get("status") == "notrun":
            outcome = "skipped"
        elif case.find("failure") is not None or case.get("status") == "fail":
            outcome = "failed"
        else:
            outcome = "passed"
        cases.append((name, outcome, float(case.get("time") or 0.0), labels.get(name, ["(none)"])))

    per_label = collections.defaultdict(lambda: collections.Counter())
    seconds = collections.defaultdict(float)
    for name, outcome, t, labs in cases:
        for lab in labs:
            per_label[lab]["tests"] += 1
            per_label[lab][outcome] += 1
            seconds[lab] += t
    print("== test report (per label)")
    print(f"{'label':<14}{'tests':>7}{'passed':>8}{'failed':>8}{'skipped':>9}{'seconds':>10}")
    for lab in sorted(per_label):
        c = per_label[lab]
        print(f"{lab:<14}{c['tests']:>7}{c['passed']:>8}{c['failed']:>8}{c['skipped']:>9}{seconds[lab]:>10.1f}")
    total = sum(t for _, _, t, _ in cases)
    print(f"{'all':<14}{len(cases):>7}{'':>8}{'':>8}{'':>9}{total:>10.1f}  (test seconds, summed over parallel runs)")
    print(f"== the {args.slowest} slowest tests")
    for name, outcome, t, labs in sorted(cases, key=lambda c: -c[2])[: args.slowest]:
        print(f"{t:>8.1f} s  {name}  [{','.join(labs)}]{'' if outcome == 'passed' else '  ' + outcome.upper()}")

    bad = [(n, labs) for n, outcome, _, labs in cases if outcome == "skipped" and ALLOWED_SKIP_LABEL not in labs]
    if bad:
        print(f"== FAILED: {len(bad)} test(s) without the '{ALLOWED_SKIP_LABEL}' label skipped (a skip is not a pass):")
        for name, labs in bad:
            print(f"  {name}  [{','.join(labs)}]")
        return 1
    if not cases:
        print("== FAILED: the JUnit file lists no tests")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
