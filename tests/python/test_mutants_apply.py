"""tests/mutation/mutants.py stays in step with kernels/: every mutant's text occurs exactly once
in its file (run.py refuses a mutant that does not, so a kernel edit that moves one would leave
the mutation run short). The run itself is slow and not part of the suite: tests/mutation/README.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "mutation"))
from mutants import M  # noqa: E402


@pytest.mark.parametrize("mid", sorted(M))
def test_mutant_applies_once(mid):
    f, old, new, note = M[mid]
    text = (ROOT / "kernels" / f).read_text()
    assert text.count(old) == 1, f"{mid} ({note}): its text occurs {text.count(old)} times in kernels/{f}"
    assert old != new and note
