"""bench/torch_compare.py: ours against PyTorch eager, paired run by run."""
import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import moe_routing

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


def run_script(*args):
    """The script run with `args`, under the machine's THP setting (THP_MEM_ALLOC_ENABLE unset), so
    that `--thp default` runs in the script's own process."""
    env = dict(os.environ)
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def assert_row_measured(r):
    # out= and functional (fresh outputs), ours and PyTorch's, and the paired ratios.
    for field in ("ours_s", "torch_s", "speedup", "ours_fresh_s", "torch_fresh_s", "fresh_speedup",
                  "fresh_over_out"):
        assert float(r[field]) > 0, (field, r)


def test_small_sweep_prints_and_writes_every_row(tmp_path):
    out = tmp_path / "tc.csv"
    done = run_script("--shapes", "mixtral", "--tokens", "1,3", "--runs", "1", "--thp", "default", "--csv", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(out)))
    ops = ["forward", "backward", "combine", "combine_backward"]
    assert [(r["op"], r["tokens"]) for r in rows] == [(op, n) for n in ("1", "3") for op in ops]
    for r in rows:
        assert r["thp"] == "default"
        assert_row_measured(r)
    for expr in ("torch_expr", "torch_fresh_expr"):
        assert {r[expr] for r in rows if r["op"] == "combine"} <= {"index_select+mul+sum", "index_select+bmm",
                                                                   "index_add_"}
    assert "[torch_compare 4/4] combine mixtral N=3 (THP default)" in done.stderr
    assert done.stdout.count("mixtral") == 8


def test_both_thp_settings_each_in_a_process_of_its_own(tmp_path):
    # --thp default,1: one child per setting (PyTorch reads THP_MEM_ALLOC_ENABLE once), merged into
    # one line per row with the functional columns of each setting.
    out = tmp_path / "tc.csv"
    done = run_script("--shapes", "mixtral", "--tokens", "2", "--runs", "1", "--ops", "dispatch", "--csv", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(out)))
    assert [(r["thp"], r["op"]) for r in rows] == [(t, op) for t in ("default", "1") for op in ("forward", "backward")]
    for r in rows:
        assert_row_measured(r)
    assert "(THP default)" in done.stderr and "(THP 1)" in done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith(("forward", "backward"))]
    assert len(table) == 2 and all(line.count("|") == 4 for line in table)
    done = run_script("--thp", "2")
    assert done.returncode == 2 and "--thp: unknown setting '2'" in done.stderr


def test_combine_rows_alone_and_unknown_ops(tmp_path):
    out = tmp_path / "tc.csv"
    done = run_script("--shapes", "qwen3-30b", "--tokens", "2", "--runs", "1", "--ops", "combine", "--thp", "default",
                      "--csv", str(out))
    assert done.returncode == 0, done.stderr
    assert [r["op"] for r in csv.DictReader(open(out))] == ["combine", "combine_backward"]
    done = run_script("--ops", "unpermute")
    assert done.returncode == 2 and "--ops: unknown operator 'unpermute'" in done.stderr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_combine_torch_expressions_compute_our_operators_math(dtype):
    # The PyTorch contenders must compute what ours do: the forward to rounding (other summation
    # orders), grad_expanded_x bit for bit (one product rounded once), grad_scales to rounding.
    tc = load_module()
    gen = torch.Generator().manual_seed(0)
    tc.SHAPES["tiny"] = (24, 5, 3)
    try:
        case = tc.combine_case("tiny", 7, dtype, gen)
    finally:
        del tc.SHAPES["tiny"]
    expected = moe_routing.moe_finalize_routing(case["y"], case["eri"], scales=case["scales"], drop_pad_mode=2)
    out, expressions = tc.combine_torch_forward(case)
    assert set(expressions) == {"index_select+mul+sum", "index_select+bmm", "index_add_"}
    for name, fn in expressions.items():
        out.zero_()
        assert fn() is out
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=1e-2, msg=name)
    _, fresh = tc.combine_torch_forward(case, fresh=True)  # the functional forms: new tensors
    for name, fn in fresh.items():
        got = fn()
        assert got is not out and got.dtype == out.dtype
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=1e-2, msg=name)
    grad_y = torch.randn(7, 24, generator=gen).to(dtype)
    expected = moe_routing.moe_finalize_routing_grad(grad_y, case["eri"], case["y"], case["scales"])
    outs, expressions = tc.combine_torch_backward(case, grad_y)
    for name, fn in expressions.items():
        outs[0].zero_()
        outs[1].zero_()
        fn()
        assert torch.equal(outs[0], expected[0]), name
        torch.testing.assert_close(outs[1], expected[1], rtol=1e-2, atol=1e-2, msg=name)
    _, fresh = tc.combine_torch_backward(case, grad_y, fresh=True)
    for name, fn in fresh.items():
        grad_x, grad_scales = fn()
        assert grad_x is not outs[0] and torch.equal(grad_x, expected[0]), name
        torch.testing.assert_close(grad_scales, expected[1], rtol=1e-2, atol=1e-2, msg=name)
