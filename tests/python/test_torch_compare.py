"""bench/torch_compare.py: ours against PyTorch eager, paired run by run."""
import csv
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "torch_compare.py")


def load_module():
    spec = importlib.util.spec_from_file_location("torch_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_speedup_is_the_median_of_per_run_ratios():
    tc = load_module()
    # Run 1 is slow for both (a slow phase): the paired ratios are 2, 2, 3 -> 2, while the ratio
    # of the medians would be 4 / 1 = 4.
    assert tc.paired_speedup([1.0, 10.0, 1.0], [2.0, 20.0, 3.0]) == 2.0


def test_every_timed_call_starts_from_the_same_state_and_runs_are_interleaved(monkeypatch):
    tc = load_module()
    calls = []
    monkeypatch.setattr(tc, "scrub_cache", lambda: calls.append("scrub"))
    a = lambda: calls.append("a")  # noqa: E731
    b = lambda: calls.append("b")  # noqa: E731
    times = tc.run_times([a, b], runs=3, min_seconds=0.0, start="scrubbed")
    assert [len(t) for t in times] == [3, 3]
    timed = calls[4:]  # after the warm-up and the sizing run, which start from nothing in particular
    assert timed == ["scrub", "a", "scrub", "b", "scrub", "b", "scrub", "a", "scrub", "a", "scrub", "b"]
    # Warm: each timed call right after an untimed call of the same function.
    calls.clear()
    tc.run_times([a, b], runs=2, min_seconds=0.0, start="warm")
    assert calls[4:] == ["a", "a", "b", "b", "b", "b", "a", "a"]
    # Which start a size gets: scrubbed from 64 MiB moved, warm below, neither with --no-scrub.
    assert tc.start_state(64 << 20) == "scrubbed"
    assert tc.start_state((64 << 20) - 1) == "warm"
    assert tc.start_state(1 << 30, no_scrub=True) is None


def test_small_sweep_prints_and_writes_every_row(tmp_path):
    out = tmp_path / "tc.csv"
    done = subprocess.run([sys.executable, SCRIPT, "--shapes", "mixtral", "--tokens", "1,3", "--runs", "1",
                           "--csv", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(out)))
    assert [(r["op"], r["tokens"]) for r in rows] == [("forward", "1"), ("backward", "1"),
                                                      ("forward", "3"), ("backward", "3")]
    for r in rows:
        assert float(r["ours_s"]) > 0 and float(r["torch_s"]) > 0 and float(r["speedup"]) > 0
    assert "[torch_compare 2/2] mixtral N=3" in done.stderr
    assert done.stdout.count("mixtral") == 4
