#!/usr/bin/python3
"""Mutation testing: does a wrong kernel, or a wrong CPU op, fail a test?

  tests/mutation/run.py [--cpu] [--deep] [--dir DIR] [--out TSV] [ID ...]

Two targets, each a dict of hand-written mutants (id -> file, text, replacement, note):
- the CUDA kernels (default; tests/mutation/mutants.py, files under kernels/), met on the CUDA
  emulator: rebuild libact_cuda_emu.so (kernels/*.cu compiled as host code), run ctest's
  test_backend_ops_emu, and with --deep, if that passed, every other emulator test (the
  backend-op variants and thread orders, the emulator checks, the end-to-end parity);
- the CPU backend (--cpu; tests/mutation/mutants_cpu.py, files under engine/), the oracle the
  kernels are held to: rebuild a CPU-only Release tree, run test_cpu_ops (both GEMM threadings),
  test_model, test_session and tests/python/test_parity.py, and with --deep every other
  non-emulator ctest and the pytest files that run the CPU forward pass.
Each mutant (all of the target's when no ID is given) is applied to a scratch git worktree of
HEAD (DIR, default $TMPDIR/act_mutation or $TMPDIR/act_mutation_cpu; made and built on first
use, a few minutes), which is never this checkout: uncommitted changes are not tested, and
nothing here is ever left mutated. The mutated directory is restored after each. One line per
mutant, tab-separated: id, file:line, what it breaks, KILLED / SURVIVED / BUILD-FAIL, the tests
that failed, seconds; appended to --out as well when given.

A survivor is either a gap in the tests (add a check that fails on it, see README.md) or an
equivalent mutant (computes the same thing on every path the engine takes: say why in its note).
Needs no GPU: this is how the kernels are held to their CPU twins on a machine without one.
"""
import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# What a target mutates and how a mutant is met. src: the directory its files are under; cmake:
# the scratch tree's configure flags; build: what each mutant rebuilds; need: a file the build
# must make; shallow/deep: (ctest regex, ctest exclude regex, pytest files, run from the
# worktree); check: ctest regex the unmutated tree must also pass.
CPU_SHALLOW = "^(test_cpu_ops|test_cpu_ops_blas_threads|test_model|test_session)$"
TARGETS = {
    "cuda": dict(mutants="mutants", src="kernels", dir="act_mutation",
                 cmake="-DCMAKE_BUILD_TYPE=Release", build="--target act_cuda_emu",
                 need="libact_cuda_emu.so", check="^test_cuda_emu_find_checks$",
                 shallow=("^test_backend_ops_emu$", None, ""),
                 deep=("^(test_backend_ops_emu_.*|test_cuda_emu_.*|test_cuda_e2e_emu.*)$", None, "")),
    "cpu": dict(mutants="mutants_cpu", src="engine", dir="act_mutation_cpu",
                cmake="-DCMAKE_BUILD_TYPE=Release -DACT_ENABLE_CUDA=OFF", build="",
                need="act-infer", check=None,
                shallow=(CPU_SHALLOW, None, "tests/python/test_parity.py"),
                deep=("^test_", "emu|" + CPU_SHALLOW,
                      "tests/python/test_cli.py tests/python/test_eval.py "
                      "tests/python/test_bench.py tests/python/test_serve.py")),
}
T = TARGETS["cuda"]
M = {}


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
        print(f"configuring ({T['cmake']})", file=sys.stderr)
        r = sh(f"cmake -S {wt} -B {build} {T['cmake']}")
        if r.returncode:
            sys.exit("cmake failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    print("building (the first build takes minutes)", file=sys.stderr)
    r = sh(f"cmake --build {build} -j{os.cpu_count() or 2}")
    if r.returncode:
        sys.exit("the unmutated build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    if not os.path.isfile(os.path.join(build, T["need"])):
        sys.exit(f"no {T['need']} in {build}" + (": the emulator needs the CUDA toolkit's headers "
                 "(ACT_ENABLE_CUDA)" if T is TARGETS["cuda"] else ""))
    rx, ex, py = T["shallow"]
    r = meet(wt, build, (rx + (f"|{T['check']}" if T["check"] else ""), ex, py), stop=False)
    if r[0]:
        sys.exit(f"the unmutated {T['src']}/ fails its own tests; fix that first:\n" + r[1][-3000:])
    return build


def ctest(build, regex, exclude=None, stop=False):
    """stop: at the first failure (a mutant is killed once); the unmutated run sees them all"""
    r = sh(f"cd {build} && ctest -j{os.cpu_count() or 2} -R '{regex}' --output-on-failure"
           + (f" -E '{exclude}'" if exclude else "") + (" --stop-on-failure" if stop else ""),
           timeout=7200)
    return r.returncode, r.stdout + r.stderr


def pytest(wt, build, files):
    """pytest files of the worktree against its build, stopping at the first failure"""
    r = sh(f"cd {wt} && ACT_BUILD_DIR={build} {PY} -m pytest -q -x -p no:cacheprovider {files}",
           timeout=7200)
    return r.returncode, r.stdout + r.stderr


def meet(wt, build, tests, stop):
    """a mutant against one set of tests: ctest first, then (if it passed) the pytest files"""
    rx, ex, py = tests
    rc, out = ctest(build, rx, ex, stop)
    if not rc and py:
        rc, out = pytest(wt, build, py)
    return rc, out


def failed_tests(out):
    names = [n + ("" if how == "Failed" else f" ({how})") for n, how in
             re.findall(r"\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|"
                        r"Exception: \S+)\)", out)]
    names += [l.split()[1] for l in out.splitlines() if l.startswith(("FAILED ", "ERROR "))]
    # a test's FAIL lines (stderr) may land inside a line of its buffered stdout
    first = [m.strip() for m in re.findall(r"(?:\bFAIL |cuda-emu:.*fault|^E ).*", out, re.M)][:3]
    return ",".join(names) + (": " + " | ".join(first) if first else "")


def restore(wt):
    sh(f"git -C {wt} checkout -- {T['src']}/")


def apply(wt, mid):
    f, old, new, _ = M[mid]
    p = os.path.join(wt, T["src"], f)
    s = open(p).read()
    n = s.count(old)
    if n != 1:
        raise SystemExit(f"{mid}: its text occurs {n} times in {T['src']}/{f} (the source changed:"
                         f" update tests/mutation/{T['mutants']}.py)")
    open(p, "w").write(s.replace(old, new))
    return f"{f}:{s[:s.index(old)].count(chr(10)) + 1}"


def one(wt, build, mid, deep):
    t0 = time.time()
    loc = apply(wt, mid)
    try:
        r = sh(f"cmake --build {build} {T['build']} -j{os.cpu_count() or 2}")
        if r.returncode:
            verdict, why = "BUILD-FAIL", ""
        else:
            rc, out = meet(wt, build, T["shallow"], stop=True)
            if not rc and deep:
                rc, out = meet(wt, build, T["deep"], stop=True)
            verdict, why = ("KILLED", failed_tests(out)) if rc else ("SURVIVED", "")
    finally:
        restore(wt)
    return "\t".join([mid, loc, M[mid][3], verdict, why[:400], f"{time.time() - t0:.0f}s"])


def main():
    global T, M
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", help="mutant ids (default: all of the target's)")
    ap.add_argument("--cpu", action="store_true",
                    help="the CPU backend's mutants (engine/) instead of the kernels'")
    ap.add_argument("--deep", action="store_true",
                    help="a mutant the shallow tests miss meets the target's whole suite")
    ap.add_argument("--dir", help="the scratch worktree (default: $TMPDIR/act_mutation, "
                    "act_mutation_cpu with --cpu)")
    ap.add_argument("--out", help="append each line to this TSV file too")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    a = ap.parse_args()
    T = TARGETS["cpu" if a.cpu else "cuda"]
    M = importlib.import_module(T["mutants"]).M
    if a.list:
        for k, v in M.items():
            print(f"{k}\t{T['src']}/{v[0]}\t{v[3]}")
        return 0
    bad = [i for i in a.ids if i not in M]
    if bad:
        sys.exit(f"unknown mutant id(s) {', '.join(bad)}: --list names them")
    wt = os.path.abspath(a.dir or os.path.join(tempfile.gettempdir(), T["dir"]))
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
        sh(f"cmake --build {build} {T['build']} -j{os.cpu_count() or 2}")
    print(f"{len(ids) - survived} of {len(ids)} killed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
