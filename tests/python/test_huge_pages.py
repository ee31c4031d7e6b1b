"""The functional operators' new outputs: large CPU ones come from the output cache (moe_routing.empty_cache,
set_output_cache_limit, MOE_ROUTING_OUTPUT_CACHE_MB), reused once freed; new memory gets huge pages asked for
(moe_routing.set_huge_pages, MOE_ROUTING_HUGE_PAGES read once, default on); and the same bits as the out= calls
whatever a reused buffer held."""
import gc
import os
import subprocess
import sys

import pytest
import torch

import moe_routing

THP = os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE = 2 << 20


@pytest.fixture
def huge_pages():
    """Turns the huge-page advice on or off for the test (moe_routing.set_huge_pages), restoring the setting
    after."""
    before = torch.ops.moe_routing._huge_pages_enabled()
    yield moe_routing.set_huge_pages
    moe_routing.set_huge_pages(before)


@pytest.fixture
def output_cache():
    """An empty output cache with its default limit for the test, restored after it. Tensors of earlier tests
    (pytest runs every file in one process) are collected first; tests compare in_use_bytes with the value
    the fixture yields."""
    gc.collect()
    limit = moe_routing.output_cache_stats()["limit_bytes"]
    moe_routing.empty_cache()
    yield moe_routing.output_cache_stats()["in_use_bytes"]
    moe_routing.set_output_cache_limit(limit)
    moe_routing.empty_cache()


def vm_flags(address):
    """The VmFlags of the mapping of /proc/self/smaps holding `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


def interior(t):
    """An address inside the tensor's 2 MiB-aligned interior."""
    return (t.data_ptr() + HUGE - 1) // HUGE * HUGE


def routing(n, k, e, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)]).to(torch.int32)


def forward_case(n=160, k=4, e=16, h=4100, dtype=torch.bfloat16):  # expanded_x ~5 MiB
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, h, generator=gen).to(dtype), routing(n, k, e)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_new_outputs_get_huge_pages_advised_unless_turned_off(huge_pages, output_cache):
    x, idx = forward_case(n=1024, k=8, e=64, h=4096)  # expanded_x of 64 MiB
    # From the output cache: new memory of its own, advised as it is mapped.
    for enabled in (True, False):
        huge_pages(enabled)
        moe_routing.empty_cache()
        expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
        assert expanded_x.nbytes == 64 << 20
        assert ("hg" in vm_flags(interior(expanded_x))) == (THP and enabled)
        del expanded_x
    # The cache off: from PyTorch's allocator (glibc maps it anew for every call, so each
    # allocation's advice is its own), advised after it.
    moe_routing.set_output_cache_limit(0)
    huge_pages(True)
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
    assert ("hg" in vm_flags(interior(expanded_x))) == THP
    del expanded_x
    huge_pages(False)
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
    if not os.environ.get("THP_MEM_ALLOC_ENABLE"):  # PyTorch's own advice would set the flag
        assert "hg" not in vm_flags(interior(expanded_x))


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_the_environment_is_not_read_again_once_huge_pages_were_used(huge_pages, output_cache, monkeypatch):
    # Before: MOE_ROUTING_HUGE_PAGES was read on every allocation, with the GIL released, racing other threads'
    # os.environ[...] = ... (undefined behaviour in C); here the variable set now turned the advice off.
    x, idx = forward_case(n=1024, k=8, e=64, h=4096)  # expanded_x of 64 MiB
    huge_pages(True)
    monkeypatch.setenv("MOE_ROUTING_HUGE_PAGES", "0")
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
    assert ("hg" in vm_flags(interior(expanded_x))) == THP
    assert torch.ops.moe_routing._huge_pages_enabled()


def test_the_environment_sets_huge_pages_at_import_and_set_huge_pages_after():
    script = ("import os, moe_routing, torch\n"
              "enabled = torch.ops.moe_routing._huge_pages_enabled\n"
              "first = enabled()\n"
              "os.environ['MOE_ROUTING_HUGE_PAGES'] = '1'\n"
              "later = enabled()\n"
              "moe_routing.set_huge_pages(True)\n"
              "print(first, later, enabled())\n")
    env = dict(os.environ, MOE_ROUTING_HUGE_PAGES="0")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", str(sys.platform == "linux")]


def test_the_environment_is_read_at_import_not_in_a_call():
    # The first read of each variable ran inside the first operator call, which PyTorch makes without the GIL:
    # a getenv that could race another Python thread's os.environ write. Now they are read while the extension
    # loads, so a change between the import and the first call has no effect.
    script = ("import os, moe_routing, torch\n"
              "os.environ['MOE_ROUTING_HUGE_PAGES'] = '1'\n"
              "os.environ['MOE_ROUTING_OUTPUT_CACHE_MB'] = '64'\n"
              "print(torch.ops.moe_routing._huge_pages_enabled(), moe_routing.output_cache_stats()['limit_bytes'])\n")
    env = dict(os.environ, MOE_ROUTING_HUGE_PAGES="0", MOE_ROUTING_OUTPUT_CACHE_MB="32")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", str(32 << 20)]


@pytest.mark.parametrize("bad", [1, "0", None, 1.0], ids=["int", "str", "None", "float"])
def test_set_huge_pages_takes_a_bool_only(huge_pages, bad):
    before = torch.ops.moe_routing._huge_pages_enabled()
    with pytest.raises(ValueError, match=f"set_huge_pages: enabled must be a bool, got {bad!r}"):
        moe_routing.set_huge_pages(bad)
    assert torch.ops.moe_routing._huge_pages_enabled() == before
    for enabled in (False, True, False):
        moe_routing.set_huge_pages(enabled)
        assert torch.ops.moe_routing._huge_pages_enabled() == (enabled and sys.platform == "linux")


def test_freed_outputs_are_reused_and_the_cache_keeps_within_its_limit(output_cache):
    x, idx = forward_case()
    before = moe_routing.output_cache_stats()
    first = moe_routing.moe_init_routing(x, idx, expert_num=16)[0]
    address, size = first.data_ptr(), first.nbytes
    assert size >= 4 << 20
    del first
    stats = moe_routing.output_cache_stats()
    assert stats["idle_bytes"] >= size and stats["in_use_bytes"] == before["in_use_bytes"]
    again = moe_routing.moe_init_routing(x, idx, expert_num=16)[0]
    assert again.data_ptr() == address
    assert moe_routing.output_cache_stats()["hits"] == stats["hits"] + 1
    # Live tensors keep their memory through empty_cache; freed ones' memory goes back to the OS.
    moe_routing.empty_cache()
    assert moe_routing.output_cache_stats()["idle_bytes"] == 0
    assert torch.equal(again, moe_routing.moe_init_routing(x, idx, expert_num=16)[0])
    # A limit below one buffer: nothing stays idle.
    moe_routing.set_output_cache_limit(1 << 20)
    del again
    assert moe_routing.output_cache_stats()["idle_bytes"] == 0
    with pytest.raises(ValueError, match="set_output_cache_limit: bytes must be >= 0, got -1"):
        moe_routing.set_output_cache_limit(-1)


@pytest.mark.parametrize("bad", [1.7, True, "12", None, 2.0])
def test_a_limit_that_is_not_an_int_is_refused_not_truncated(output_cache, bad):
    limit = moe_routing.output_cache_stats()["limit_bytes"]
    with pytest.raises(ValueError, match=f"set_output_cache_limit: bytes must be an int, got {bad!r}"):
        moe_routing.set_output_cache_limit(bad)  # before: 1.7 and True set a limit of 1 byte, "12" of 12
    assert moe_routing.output_cache_stats()["limit_bytes"] == limit


def test_a_limit_beyond_int64_keeps_everything(output_cache):
    moe_routing.set_output_cache_limit(1 << 64)  # before: a RuntimeError about the schema's int
    assert moe_routing.output_cache_stats()["limit_bytes"] == (1 << 63) - 1


def test_an_output_from_the_cache_behaves_as_any_tensor(output_cache):
    x, idx = forward_case()
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=16)[0]
    expected = expanded_x.clone()
    view = expanded_x[3:5]
    expanded_x.resize_(expanded_x.shape[0] * 2, expanded_x.shape[1])  # a new, larger storage
    assert torch.equal(expanded_x[: expected.shape[0]], expected)
    assert torch.equal(view, expected[3:5])  # the old storage lives on with its view
    del expanded_x, view
    assert moe_routing.output_cache_stats()["in_use_bytes"] == output_cache


def test_the_environment_sets_the_limit_and_zero_turns_the_cache_off(tmp_path):
    script = ("import torch, moe_routing\n"
              "x = torch.randn(160, 4100).bfloat16()\n"
              "idx = torch.randint(0, 16, (160, 4), dtype=torch.int32)\n"
              "out = moe_routing.moe_init_routing(x, idx, expert_num=16)\n"
              "del out\n"
              "s = moe_routing.output_cache_stats()\n"
              "print(s['limit_bytes'], s['misses'], s['idle_bytes'])\n")
    for mib, expected in (("0", (0, 0, 0)), ("16", (16 << 20, 1, 6 << 20))):
        env = dict(os.environ, MOE_ROUTING_OUTPUT_CACHE_MB=mib)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert tuple(int(v) for v in out.stdout.split()) == expected
    # Not a whole number of MiB: a warning, and the default limit.
    env = dict(os.environ, MOE_ROUTING_OUTPUT_CACHE_MB="16MB")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert 'MOE_ROUTING_OUTPUT_CACHE_MB must be a whole number of MiB >= 0, got "16MB"' in out.stderr
    assert int(out.stdout.split()[0]) == moe_routing.output_cache_stats()["limit_bytes"] or \
        os.environ.get("MOE_ROUTING_OUTPUT_CACHE_MB") is not None


def test_the_cache_variable_allows_surrounding_blanks_as_the_thread_variable_does():
    # Before: strtoll skipped leading blanks but not trailing ones, so " 16" set 16 MiB while "16 " warned and
    # kept the default; MOE_ROUTING_NUM_THREADS allowed both. The variables now share one reading.
    script = "import moe_routing\nprint(moe_routing.output_cache_stats()['limit_bytes'])\n"
    for mib in (" 16", "16 ", " 16\t", "+016"):
        env = dict(os.environ, MOE_ROUTING_OUTPUT_CACHE_MB=mib)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert (int(out.stdout), out.stderr) == (16 << 20, ""), repr(mib)
    for mib in ("", "16 MB", "0x10", "-1", "1e3"):
        env = dict(os.environ, MOE_ROUTING_OUTPUT_CACHE_MB=mib)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert f'MOE_ROUTING_OUTPUT_CACHE_MB must be a whole number of MiB >= 0, got "{mib}"' in out.stderr, repr(mib)


def poisoned(make):
    """make()'s result, after a call of it whose large outputs were overwritten with 0xff bytes (NaNs) and
    freed: with the output cache on, the result's buffers are those, so an element the operator does not
    write shows."""
    result = make()
    cached = moe_routing.output_cache_stats()["min_bytes"]
    large = [t for t in (result if isinstance(result, (tuple, list)) else (result,)) if t.nbytes >= cached]
    tensor = None
    for tensor in large:
        tensor.view(torch.uint8).fill_(0xFF)
    del result, tensor
    large = len(large)  # drops the last references
    hits = moe_routing.output_cache_stats()["hits"]
    result = make()
    if moe_routing.output_cache_stats()["limit_bytes"] > 0:  # the poisoned buffers were reused
        assert moe_routing.output_cache_stats()["hits"] == hits + large
    return result


@pytest.mark.parametrize("setting", [True, False, "no-cache"], ids=["advised", "off", "no-cache"])
def test_functional_calls_equal_out_calls_bit_for_bit(huge_pages, output_cache, setting):
    huge_pages(setting is not False)
    if setting == "no-cache":
        moe_routing.set_output_cache_limit(0)
    x, idx = forward_case()
    kw = dict(expert_num=16, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    fresh = poisoned(lambda: moe_routing.moe_init_routing(x, idx, **kw))
    assert fresh[0].nbytes >= 4 << 20
    outs = tuple(torch.full_like(t, 7) for t in fresh)
    moe_routing.moe_init_routing(x, idx, **kw, out=outs)
    for a, b in zip(fresh, outs):
        assert torch.equal(a, b)
    eri = fresh[1]
    n, k = idx.shape
    gen = torch.Generator().manual_seed(2)
    # The dispatch's backward: grad_x [N, H].
    grad = torch.randn(n * k * 2, 4100, generator=gen).to(torch.bfloat16)[: n * k]
    grad_x = poisoned(lambda: moe_routing.moe_init_routing_grad(grad, eri, k))
    out = torch.full_like(grad_x, 7)
    moe_routing.moe_init_routing_grad(grad, eri, k, out=out)
    assert torch.equal(grad_x, out)
    # The combine and its grad: y [N, H], grad_expanded_x [N*K, H] (~5 MiB).
    scales = torch.rand(n, k, generator=gen)
    y = poisoned(lambda: moe_routing.moe_finalize_routing(fresh[0], eri, scales=scales, drop_pad_mode=2))
    out = torch.full_like(y, 7)
    moe_routing.moe_finalize_routing(fresh[0], eri, scales=scales, drop_pad_mode=2, out=out)
    assert torch.equal(y, out)
    grad_y = torch.randn(n, 4100, generator=gen).to(torch.bfloat16)
    grads = poisoned(lambda: moe_routing.moe_finalize_routing_grad(grad_y, eri, fresh[0], scales))
    assert grads[0].nbytes >= 4 << 20
    outs = (torch.full_like(grads[0], 7), torch.full_like(grads[1], 7))
    moe_routing.moe_finalize_routing_grad(grad_y, eri, fresh[0], scales, out=outs)
    assert torch.equal(grads[0], outs[0]) and torch.equal(grads[1], outs[1])


def _drop_pad_cases():
    """(name, call(out=None)) of operators whose large outputs have slots no pair fills (drop-pad padding,
    quantised rows, an active_num cut): the operator must write those too."""
    n, k, e, h, capacity = 256, 2, 8, 4100, 96
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, h, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, e, (n, k), generator=gen, dtype=torch.int32)
    # Row layout of drop-pad slots: 400 of the 512 pairs get distinct slots of the E*C = 768, the rest -1.
    slots = torch.full((n * k,), -1, dtype=torch.int32)
    pairs = torch.randperm(n * k, generator=gen)[:400]
    slots[pairs] = torch.randperm(e * capacity, generator=gen)[:400].to(torch.int32)
    grad_y = torch.randn(n, h, generator=gen).to(torch.bfloat16)
    padded = torch.randn(e, capacity, h, generator=gen).to(torch.bfloat16)
    scales = torch.rand(n, k, generator=gen)
    big_n = 640  # grad_x [640, 4100] bf16 > 4 MiB
    big_slots = torch.full((big_n * k,), -1, dtype=torch.int32)
    big_pairs = torch.randperm(big_n * k, generator=gen)[:700]
    big_slots[big_pairs] = torch.randperm(e * capacity, generator=gen)[:700].to(torch.int32)

    def call(fn, *args, **kw):
        return lambda out=None: fn(*args, **kw) if out is None else fn(*args, **kw, out=out)
    return [
        ("dispatch drop-pad", call(moe_routing.moe_init_routing, x, idx, expert_capacity=capacity, expert_num=e,
                                   drop_pad_mode=1)),
        ("dispatch active int8", call(moe_routing.moe_init_routing, x, idx, active_num=300, expert_num=e,
                                      quant_mode=1)),
        ("dispatch grad drop-pad", call(moe_routing.moe_init_routing_grad, padded, big_slots,
                                        k, drop_pad_mode=1)),
        ("combine grad drop-pad", call(moe_routing.moe_finalize_routing_grad, grad_y, slots, padded, scales,
                                       drop_pad_mode=1, expert_num=e, expert_capacity=capacity)),
    ]


@pytest.mark.parametrize("case", range(4), ids=[c[0] for c in _drop_pad_cases()])
def test_outputs_with_unfilled_slots_from_reused_buffers_equal_out_calls(output_cache, case):
    name, call = _drop_pad_cases()[case]
    fresh = poisoned(call)
    fresh = fresh if isinstance(fresh, (tuple, list)) else (fresh,)
    assert max(t.nbytes for t in fresh) >= moe_routing.output_cache_stats()["min_bytes"], name
    outs = tuple(torch.full_like(t, 7) if t.numel() else t for t in fresh)
    call(out=outs if len(outs) > 1 else outs[0])
    for a, b in zip(fresh, outs):
        assert torch.equal(a, b), name


def test_the_cache_factory_gives_fake_tensors_under_fake_mode_and_compiles(output_cache):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from moe_routing import _cache
    real = _cache.empty((4 << 20,), torch.uint8, "cpu")
    assert not isinstance(real, FakeTensor)
    assert moe_routing.output_cache_stats()["in_use_bytes"] == output_cache + (4 << 20)
    del real
    with FakeTensorMode():
        fake = _cache.empty((4 << 20,), torch.uint8, "cpu")
    assert isinstance(fake, FakeTensor) and fake.shape == (4 << 20,)
    assert moe_routing.output_cache_stats()["in_use_bytes"] == output_cache
    fn = torch.compile(lambda x: _cache.empty((x.shape[0], 1024), torch.float32, "cpu").fill_(1).sum() + x.sum())
    assert fn(torch.ones(2048)).item() == 2048 * 1024 + 2048


def test_the_cache_factory_checks_its_shape_once_with_its_own_name(output_cache):
    empty = torch.ops.moe_routing._empty_from_output_cache
    with pytest.raises(ValueError,
                       match=r"_empty_from_output_cache: the tensor's shape entries must be >= 0, got \[4, -1\]"):
        empty([4, -1], torch.float32)
    with pytest.raises(ValueError, match=r"_empty_from_output_cache: the tensor must have at most 2\^62 bytes"):
        empty([1 << 31, 1 << 31], torch.float32)  # 2^64 bytes
    assert moe_routing.output_cache_stats()["in_use_bytes"] == output_cache  # nothing handed out
    t = empty([1 << 30, 0], torch.float32)  # an empty tensor is not an overflow
    assert t.shape == (1 << 30, 0)
