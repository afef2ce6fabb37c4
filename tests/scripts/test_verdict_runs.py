"""`scripts/verdict_runs.py`: the verdicts of committed runs side by side, and how often they agree."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "verdict_runs.py"


def _module():
    spec = importlib.util.spec_from_file_location("verdict_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(commit: str, kind: str, *verdicts: str) -> dict:
    return {"commit": commit, "kind": kind, "backward_ms": 18.0,
            "verdicts": {f"e{i}": v for i, v in enumerate(verdicts)}}


def test_agreement_counts_runs_alike_and_tells_a_less_sure_run_from_a_contradiction():
    vr = _module()
    runs = [run("a", "avx2", "equivalent", "inconclusive", "better"),
            run("b", "avx2", "equivalent", "equivalent", "equivalent"),
            run("c", "avx512", "equivalent", "inconclusive", "better")]
    rates = vr.agreement(runs)
    assert rates["avx2"] == {"runs": 2, "endpoints": 3, "same_in_every_run": 1, "same_share": 1 / 3,
                             "pair_agreement": 1 / 3, "contradicting_pairs": 1, "pairs": 3}
    assert rates["all"]["same_in_every_run"] == 1 and rates["all"]["pairs"] == 9
    assert rates["all"]["contradicting_pairs"] == 2, "better against equivalent, twice; inconclusive never counts"
    page = vr.page(runs, rates)
    assert "| e2 | better | equivalent | better |" in page and "| avx2 | 2 | 3 | 1 | 33% | 33% | 1 of 3 |" in page
    assert "| machine kind | runs | endpoints |" in page


def test_a_since_commit_this_clone_lacks_is_refused_in_one_line(capsys):
    import pytest

    with pytest.raises(SystemExit, match="--since 0123456789ab: not a commit of this clone"):
        _module().runs_since("0123456789ab")
