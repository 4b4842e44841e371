#!/usr/bin/python3
"""Mutation testing of the CUDA kernels on the CUDA emulator: does a wrong kernel fail a test?

  tests/mutation/run.py [--deep] [--dir DIR] [--out TSV] [ID ...]

Each mutant (tests/mutation/mutants.py; all of them when no ID is given) is applied to a scratch
git worktree of HEAD (DIR, default $TMPDIR/act_mutation; made and built on first use, a few
minutes), which is never this checkout: uncommitted changes are not tested, and nothing here is
ever left mutated. Per mutant: rebuild the emulator (libact_cuda_emu.so, which compiles
kernels/*.cu as host code), run ctest's test_backend_ops_emu, and with --deep, if that passed,
every other emulator test (the backend-op variants and thread orders, the emulator checks, the
end-to-end parity). The kernels are restored after each. One line per mutant, tab-separated:
id, file:line, what it breaks, KILLED / SURVIVED / BUILD-FAIL, the tests that failed, seconds;
appended to --out as well when given.

A survivor is either a gap in the tests (add a check that fails on it, see README.md) or an
equivalent mutant (computes the same thing on every path the engine takes: say why in its note).
Needs no GPU: this is how the kernels are held to their CPU twins on a machine without one.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from mutants import M  # noqa: E402

SHALLOW = "^test_backend_ops_emu$"
DEEP = "^(test_backend_ops_emu_.*|test_cuda_emu_.*|test_cuda_e2e_emu.*)$"


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, **kw)


def prepare(wt):
    """the scratch worktree at HEAD, configured and built, its test data made"""
    head = sh(f"git -C {SOURCE} rev-parse HEAD").stdout.strip()
    if not os.path.isdir(wt):
        print(f"making the scratch worktree {wt} at {head[:10]}", file=sys.stderr)
        r = sh(f"git -C {SOURCE} worktree add --detach {wt} {head}")
        if r.returncode:
            sys.exit(f"git worktree add {wt}: {r.stderr.strip()}")
    else:
        if sh(f"git -C {wt} status --porcelain").stdout.strip():
            sys.exit(f"{wt} has changes of its own (an interrupted run?): "
                     f"git -C {wt} checkout -- . and rerun")
        r = sh(f"git -C {wt} checkout -q --detach {head}")
        if r.returncode:
            sys.exit(f"{wt}: cannot check out {head[:10]}: {r.stderr.strip()}")
    build = os.path.join(wt, "build")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        print("configuring (Release, CUDA on for the emulator)", file=sys.stderr)
        r = sh(f"cmake -S {wt} -B {build} -DCMAKE_BUILD_TYPE=Release")
        if r.returncode:
            sys.exit("cmake failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    print("building (the first build takes minutes)", file=sys.stderr)
    r = sh(f"cmake --build {build} -j{os.cpu_count() or 2}")
    if r.returncode:
        sys.exit("the unmutated build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    if not os.path.isfile(os.path.join(build, "libact_cuda_emu.so")):
        sys.exit("no libact_cuda_emu.so: the emulator needs the CUDA toolkit's headers "
                 "(ACT_ENABLE_CUDA)")
    r = ctest(build, SHALLOW + "|^test_cuda_emu_find_checks$")
    if r[0]:
        sys.exit("the unmutated kernels fail their own tests; fix that first:\n" + r[1][-3000:])
    return build


def ctest(build, regex, stop=False):
    """stop: at the first failure (a mutant is killed once); the unmutated run sees them all"""
    r = sh(f"cd {build} && ctest -j{os.cpu_count() or 2} -R '{regex}' --output-on-failure"
           + (" --stop-on-failure" if stop else ""), timeout=7200)
    return r.returncode, r.stdout + r.stderr


def failed_tests(out):
    names = re.findall(r"\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Subprocess aborted|"
                       r"Exception: \S+)\)", out)
    first = [l.strip() for l in out.splitlines()
             if l.startswith("FAIL") or "cuda-emu:" in l and "fault" in l][:3]
    return ",".join(names) + (": " + " | ".join(first) if first else "")


def restore(wt):
    sh(f"git -C {wt} checkout -- kernels/")


def apply(wt, mid):
    f, old, new, _ = M[mid]
    p = os.path.join(wt, "kernels", f)
    s = open(p).read()
    n = s.count(old)
    if n != 1:
        raise SystemExit(f"{mid}: its text occurs {n} times in kernels/{f} (the kernel changed:"
                         " update tests/mutation/mutants.py)")
    open(p, "w").write(s.replace(old, new))
    return f"{f}:{s[:s.index(old)].count(chr(10)) + 1}"


def one(wt, build, mid, deep):
    t0 = time.time()
    loc = apply(wt, mid)
    try:
        r = sh(f"cmake --build {build} --target act_cuda_emu -j{os.cpu_count() or 2}")
        if r.returncode:
            verdict, why = "BUILD-FAIL", ""
        else:
            rc, out = ctest(build, SHALLOW)
            if not rc and deep:
                rc, out = ctest(build, DEEP, stop=True)
            verdict, why = ("KILLED", failed_tests(out)) if rc else ("SURVIVED", "")
    finally:
        restore(wt)
    return "\t".join([mid, loc, M[mid][3], verdict, why[:400], f"{time.time() - t0:.0f}s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", help="mutant ids (default: all %d)" % len(M))
    ap.add_argument("--deep", action="store_true",
                    help="a mutant test_backend_ops_emu misses meets every emulator test")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "act_mutation"),
                    help="the scratch worktree (default: %(default)s)")
    ap.add_argument("--out", help="append each line to this TSV file too")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    a = ap.parse_args()
    if a.list:
        for k, v in M.items():
            print(f"{k}\tkernels/{v[0]}\t{v[3]}")
        return 0
    bad = [i for i in a.ids if i not in M]
    if bad:
        sys.exit(f"unknown mutant id(s) {', '.join(bad)}: --list names them")
    wt = os.path.abspath(a.dir)
    build = prepare(wt)
    ids = a.ids or list(M)
    survived = 0
    try:
        for i, mid in enumerate(ids):
            print(f"[{i + 1}/{len(ids)}] {mid}: {M[mid][3]}", file=sys.stderr, flush=True)
            line = one(wt, build, mid, a.deep)
            survived += "\tSURVIVED\t" in line
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    finally:
        restore(wt)
        sh(f"cmake --build {build} --target act_cuda_emu -j{os.cpu_count() or 2}")
    print(f"{len(ids) - survived} of {len(ids)} killed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
