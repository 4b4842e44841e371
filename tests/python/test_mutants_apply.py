"""tests/mutation/mutants.py stays in step with kernels/, and mutants_cpu.py with engine/: every
mutant's text occurs exactly once in its file (run.py refuses a mutant that does not, so a source
edit that moves one would leave the mutation run short). The run itself is slow and not part of
the suite: tests/mutation/README.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "mutation"))
from mutants import M  # noqa: E402
from mutants_cpu import M as M_CPU  # noqa: E402

CASES = [("kernels", mid, M[mid]) for mid in sorted(M)] + [("engine", mid, M_CPU[mid]) for mid in sorted(M_CPU)]


@pytest.mark.parametrize("src, mid, mutant", CASES, ids=[f"{s}-{m}" for s, m, _ in CASES])
def test_mutant_applies_once(src, mid, mutant):
    f, old, new, note = mutant
    text = (ROOT / src / f).read_text()
    assert text.count(old) == 1, f"{mid} ({note}): its text occurs {text.count(old)} times in {src}/{f}"
    assert old != new and note


def test_ids_are_unique_across_targets():
    assert not set(M) & set(M_CPU), "a mutant id names both a kernel and a CPU mutant"


@pytest.mark.parametrize("name", ["mutants.py", "mutants_cpu.py"])
def test_no_id_is_written_twice(name):
    """a dict literal keeps the last of two equal keys: the first mutant would vanish unseen"""
    import collections
    import re
    text = (ROOT / "tests" / "mutation" / name).read_text()
    ids = re.findall(r'^\s*"([A-Z]+[0-9]+)":', text, re.M)
    twice = [k for k, n in collections.Counter(ids).items() if n > 1]
    assert ids and not twice, f"{name}: ids written twice: {twice}"
