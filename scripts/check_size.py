#!/usr/bin/env python3
"""The size guard rails of src/: function length, cyclomatic complexity and file length.

    scripts/check_size.py [ROOT]    ROOT: the repository (default: this script's parent's parent)
    scripts/check_size.py --self-test   shows that it finds a long function and a long file

Measures every function in src/ with lizard (requirements-dev.txt) and fails when
  - a function is longer than 60 lines or has a cyclomatic complexity over 25, and is not one of the
    EXISTING functions below, or is one of them and has grown past what it measured when listed;
  - a file in src/ is longer than 900 lines.
The targets (docs/architecture.md, "Size"): no function over 80 lines, at most 10 over 60, at most 5
over a complexity of 25. EXISTING holds the functions that do not meet them yet; the list only
shrinks: a function split below the limits is taken off it (the check says so), and a new long
or complex function fails. Prints where each stands against the targets.
"""

import os
import subprocess
import sys

MAX_LINES, LONG_LINES, MAX_CCN, MAX_FILE_LINES = 80, 60, 25, 900
TARGET_OVER_LONG, TARGET_OVER_CCN = 10, 5

# (file, function): (lines, complexity) when listed; neither may grow.
EXISTING = {
    ("src/agent/store/ferry_store.cc", "ferry::agent::FerryStore::call"): (61, 23),
    ("src/connect/protocol.cc", "ferry::connect::decodeMessage"): (61, 16),
    ("src/endpoint/context.cc", "ferry::endpoint::RdmaContext::open"): (64, 22),
    ("src/endpoint/operations.cc", "ferry::endpoint::EndpointImpl::resolveTransfers"): (63, 24),
    ("src/providers/soft/rc_requester.cc", "ferry::soft::RcRequester::buildRequestFrame"): (65, 18),
    ("src/providers/soft/same_host/channel.cc", "ferry::soft::SameHostChannel::copyInTwo"): (65, 18),
    ("src/providers/soft/wire.cc", "ferry::soft::wire::encodeHeader"): (62, 15),
}


def measure(root):
    """(file, function, lines, complexity) for each function lizard finds in src/."""
    lizard = os.path.join(os.path.dirname(sys.executable), "lizard")
    command = [lizard] if os.path.exists(lizard) else [sys.executable, "-m", "lizard"]
    out = subprocess.run(command + ["src", "-l", "cpp", "--csv"], cwd=root, capture_output=True, text=True)
    if out.returncode not in (0, 1) or not out.stdout:
        sys.exit("check_size: lizard failed (pip install lizard): %s" % out.stderr.strip()[-500:])
    import csv
    rows = []
    for r in csv.reader(out.stdout.splitlines()):
        rows.append((r[6], r[7], int(r[4]), int(r[1])))
    return rows


def check(root):
    problems, notes, seen = [], [], set()
    rows = measure(root)
    for path, name, lines, ccn in rows:
        if lines <= LONG_LINES and ccn <= MAX_CCN:
            continue
        key = (path, name)
        seen.add(key)
        if key not in EXISTING:
            problems.append("%s: %s is %d lines, complexity %d (limits: %d lines, complexity %d)"
                            % (path, name, lines, ccn, LONG_LINES, MAX_CCN))
            continue
        was_lines, was_ccn = EXISTING[key]
        if lines > was_lines or ccn > was_ccn:
            problems.append("%s: %s grew to %d lines, complexity %d (listed at %d, %d: split it instead)"
                            % (path, name, lines, ccn, was_lines, was_ccn))
    for key in sorted(set(EXISTING) - seen):
        notes.append("%s: %s now meets the limits: take it off EXISTING" % key)
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                n = sum(1 for _ in fh)
            if n > MAX_FILE_LINES:
                problems.append("%s: %d lines (limit %d)" % (os.path.relpath(path, root), n, MAX_FILE_LINES))
    over_max = sum(1 for r in rows if r[2] > MAX_LINES)
    over_long = sum(1 for r in rows if r[2] > LONG_LINES)
    over_ccn = sum(1 for r in rows if r[3] > MAX_CCN)
    notes.append("functions over %d lines: %d (target 0); over %d: %d (target <= %d); complexity over %d: "
                 "%d (target <= %d); %d functions measured"
                 % (MAX_LINES, over_max, LONG_LINES, over_long, TARGET_OVER_LONG, MAX_CCN, over_ccn,
                    TARGET_OVER_CCN, len(rows)))
    return problems, notes


def self_test():
    """A new long function and a long file fail; a short one passes."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "src"))
        body = "".join("  x += %d;\n" % i for i in range(LONG_LINES + 5))
        with open(os.path.join(root, "src", "long.cc"), "w") as f:
            f.write("int shortOne(int x) { return x; }\nint longOne(int x) {\n" + body + "  return x;\n}\n")
            f.write("// filler\n" * MAX_FILE_LINES)
        problems, _ = check(root)
    found_long = [p for p in problems if "longOne" in p]
    found_file = [p for p in problems if "lines (limit" in p]
    if len(problems) != 2 or len(found_long) != 1 or len(found_file) != 1:
        print("check_size: self-test FAILED: %s" % problems)
        return 1
    print("check_size: self-test passed (a new long function and a long file are found, a short one is not)")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems, notes = check(root)
    for line in problems + notes:
        print(line)
    if problems:
        print("check_size: FAILED (%d)" % len(problems))
        return 1
    print("check_size: no function or file in src/ grew past the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
