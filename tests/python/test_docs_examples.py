"""Every code example of the user documentation runs as written.

The rule: in README.md and docs/*.md (not docs/PERFORMANCE.md, whose `moe-routing bench` and
bench/*.py commands take minutes, nor docs/spec/), every fenced block tagged python, c or cpp, and
every block tagged sh that holds a `moe-routing` command, is run here or named in EXCLUDED with the
reason. test_every_block_is_run_or_excluded fails on a block that is neither (a new example comes
with its run) and on a name here that matches no block any more (an example was removed or
renamed). A block is named by its file and the start of its first line.

* python: each file's blocks, in order, in one fresh interpreter per file: a reader's session
  (README.md's combine block continues its dispatch block). A block that leaves its inputs to the
  reader (`x`, `experts`, ...) runs after SETUP, which defines them with small tensors; CHECK then
  asserts what the text around the block says the code does. A traceback names the Markdown file
  and line.
* sh: each `moe-routing` command (continuation lines joined, `moe-routing` or `build/moe-routing`
  replaced by MOE_ROUTING_CLI) in a directory of its own, on the inputs of the worked example its
  comment names (docs/spec/*.md), written under the file names the command uses; exit status 0 and
  the outputs the specification gives.
* c, cpp: each block is a fragment that leaves its buffers to the reader. It is compiled alone
  against include/ and the static library next to MOE_ROUTING_CLI, as docs/c_api.md says a program
  linking it by hand is (C: `-lstdc++ -lpthread`): its `#include` and `using namespace` lines at
  file scope, the rest in main() after SETUP (the buffers, with a worked example's data) and before
  CHECK (the example's result, bit for bit); then run.

Needs `make build` (MOE_ROUTING_CLI, the library, a C and a C++ compiler) and the package
(`make python`); `make test-python` runs it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from typing import NamedTuple

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("MOE_ROUTING_CLI", os.path.join(ROOT, "build", "moe-routing"))
BUILD_DIR = os.path.dirname(os.path.abspath(CLI))

DOC_FILES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md") and name != "PERFORMANCE.md")

# ---------------------------------------------------------------------------------------------
# Blocks not run, by name, and why.
# ---------------------------------------------------------------------------------------------
EXCLUDED = {
    ("README.md", "# forward, CANN aclnnMoeInitRoutingV2"):
        "run by tests/python/test_readme.py (every command, in order, each on the previous one's outputs)",
    ("docs/python.md", "moe_routing.moe_init_routing_grad(grad_expanded_x,"):
        "signatures, not code: `-> grad_x` lines",
    ("docs/python.md", "# before"):
        "its first half imports CANN's cann_ops_transformer, which is not installed here; its second "
        "half is docs/porting.md's `from moe_routing.ops import ...` block, which runs",
    ("docs/moe_init_routing.md", "Status moe_init_routing_v2(x, expert_idx,"):
        "a signature, not code (parameter types elided)",
    ("docs/moe_init_routing.md", "Status moe_init_routing(x, expert_idx, scale,"):
        "a signature, not code (parameter types elided)",
}

# ---------------------------------------------------------------------------------------------
# python: the files whose blocks run, SETUP before a block, CHECK after it.
# ---------------------------------------------------------------------------------------------
PYTHON_FILES = ["README.md", "docs/python.md", "docs/porting.md", "docs/distributed.md",
                "docs/moe_finalize_routing.md"]

SETUP = {
    ("docs/python.md", "import moe_routing.torch_npu as torch_npu"): """
        import torch
        n, k, h, e = 4, 2, 8, 3
        x = torch.randn(n, h)
        topk_ids = torch.tensor([[1, 0], [2, 1], [0, 2], [1, 2]], dtype=torch.int32)
        """,
    # The reader's own model: N tokens of bf16 x routed to K of E experts, fp32 routing weights,
    # a shared expert's output, the experts' bias, and expert matrices applied per expert block.
    ("docs/moe_finalize_routing.md", "import torch"): """
        import torch
        N, K, H, E = 4, 2, 8, 3
        x = torch.randn(N, H, dtype=torch.bfloat16)
        topk_idx = torch.tensor([[1, 0], [2, 1], [0, 2], [1, 2]], dtype=torch.int32)
        topk_weight = torch.rand(N, K, requires_grad=True)
        shared_out = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
        b2 = torch.randn(E, H, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(E, H, H, dtype=torch.bfloat16)
        def experts(rows, counts):   # expert e's rows are the counts[e] after the earlier experts'
            return torch.cat([r @ w[e] for e, r in enumerate(rows.split(counts.tolist()))]).requires_grad_()
        grad_out = torch.ones(N, H, dtype=torch.bfloat16)   # the gradient of out.sum()
        """,
    # A world of one: no process group is initialised in this interpreter.
    ("docs/distributed.md", "import moe_routing.distributed as ep"): """
        import torch
        N, K, H, num_experts = 4, 2, 8, 4
        x = torch.randn(N, H)
        expert_idx = torch.tensor([[1, 0], [2, 1], [0, 3], [1, 2]], dtype=torch.int32)
        topk_weight = torch.rand(N, K)
        shared_out = torch.randn(N, H)
        expert_bias = torch.randn(num_experts, H)
        w = torch.randn(num_experts, H, H)
        def my_experts(rows, tokens_per_expert):
            return torch.cat([r @ w[e] for e, r in enumerate(rows.split(tokens_per_expert.tolist()))])
        """,
}

CHECK = {
    # "The combine, with autograd": the weights and the expert outputs get their gradients.
    ("README.md", "from moe_routing.ops import moe_finalize_routing"): """
        assert weights.grad.shape == (4, 2) and expert_out.grad.shape == (8, 8)
        assert out.shape == (4, 8)
        """,
    # The comments list the statistics' keys; a limit of 0 turns the cache off.
    ("docs/python.md", "import moe_routing\nmoe_routing.output_cache_stats()"): """
        stats = moe_routing.output_cache_stats()
        assert sorted(stats) == sorted(["limit_bytes", "idle_bytes", "in_use_bytes", "hits", "misses",
                                        "min_bytes"]), stats
        assert stats["limit_bytes"] == 0 and stats["idle_bytes"] == 0, stats
        """,
    ("docs/python.md", "import moe_routing.torch_npu as torch_npu"): """
        assert callable(permute) and callable(unpermute)
        """,
    # "expanded_y, x1, b2, topk_weight get gradients"; the backward by hand gives autograd's rows.
    ("docs/moe_finalize_routing.md", "import torch"): """
        assert out.shape == (N, H) and out.dtype == torch.bfloat16
        assert expanded_y.grad.shape == (N * K, H) and shared_out.grad.shape == (N, H)
        assert b2.grad.shape == (E, H) and topk_weight.grad.shape == (N, K)
        assert grad_expanded_x.shape == (N * K, H) and grad_scales.shape == (N, K)
        assert torch.equal(grad_expanded_x, expanded_y.grad)
        assert torch.equal(grad_scales, topk_weight.grad)  # without bias and expert_idx: up to 5 apart
        """,
    # "the forward ... equal, bit for bit, the single-device computation of the same global batch".
    ("docs/distributed.md", "import moe_routing.distributed as ep"): """
        import moe_routing
        rows, row_idx, counts, _, _ = moe_routing.moe_init_routing(
            x, expert_idx, expert_num=num_experts, expert_tokens_num_type=1, expert_tokens_num_flag=True)
        assert torch.equal(tokens_per_expert, counts), (tokens_per_expert, counts)
        single = moe_routing.moe_finalize_routing(my_experts(rows, counts), row_idx, x1=shared_out,
                                                  bias=expert_bias, scales=topk_weight,
                                                  expert_idx=expert_idx, drop_pad_mode=2)
        assert y.shape == (N, H) and torch.equal(y, single)
        """,
}


# ---------------------------------------------------------------------------------------------
# sh: per command, its inputs (file name -> array) and the outputs it must write (file name ->
# values; an np.ndarray's dtype is checked too; First(n, values): the first n rows only).
# ---------------------------------------------------------------------------------------------
class First(NamedTuple):
    rows: int
    values: object


def _bf16(values):
    """bfloat16 bit patterns of values exact in bfloat16, as the tool's '<u2' files hold them."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


_F1 = {"x.npy": np.array([[1, 1.5], [2, 2.5], [3, 3.5]], np.float32),
       "idx.npy": np.array([[1, 0], [2, 1], [0, 2]], np.int32)}
_F2 = {"x.npy": np.array([[10], [20], [30], [40]], np.float32),
       "idx.npy": np.array([[0, 1], [0, 2], [0, 1], [1, 0]], np.int32)}
_F3 = {"x.npy": np.array([[1, 2], [3, 4], [5, 6]], np.float32),
       "idx.npy": np.array([[1, 3], [0, 2], [2, 1]], np.int32),
       "w.npy": np.array([[.1, .2], [.3, .4], [.5, .6]], np.float32)}
# Q2 (static int8): one token, K = 1; s.npy and o.npy are the scale and offset.
_Q2 = {"x.npy": np.array([[1.0, -0.75, 0.25, 100.0, -1.25]], np.float32),
       "idx.npy": np.array([[0]], np.int32),
       "s.npy": np.array([2.0], np.float32), "o.npy": np.array([0.5], np.float32)}
# The combine example of docs/spec/moe_finalize_routing.md (N = 2, K = 2, H = 1): rows 1..4,
# pairs (0,0) -> row 1, (0,1) -> row 3, (1,0) -> row 0, (1,1) -> row 2; out = {12, 25}.
_COMBINE = {"ex.npy": np.array([[1], [2], [3], [4]], np.float32),
            "r.npy": np.array([1, 3, 0, 2], np.int32),
            "w.npy": np.array([[0.5, 0.25], [2, 1]], np.float32)}

SH_BLOCKS = {
    ("docs/moe_init_routing.md", "# V2, F1: active_num 3 with the cumsum"): [
        (_F1, {"f1/expanded_x.npy": [[1, 1.5], [3, 3.5], [1, 1.5]],
               "f1/expanded_row_idx.npy": [2, 0, 4, 3, 1, 5],
               "f1/expert_tokens_count_or_cumsum.npy": [2, 4, 6]}),
        (_F2, {"f2/expanded_x.npy": [[[10], [20]], [[10], [30]], [[20], [0]]],
               "f2/expanded_row_idx.npy": [0, 2, 1, 4, -1, 3, -1, -1],
               "f2/expert_tokens_before_capacity.npy": [4, 3, 1]}),
        # Rows 4 and 5 (pairs outside the range) are unspecified in CANN: only the first 4 checked.
        (_F3, {"f3/expanded_row_idx.npy": First(4, [0, 5, 3, 4]),
               "f3/expanded_x.npy": First(4, [[1, 2], [5, 6], [3, 4], [5, 6]]),
               "f3/expert_tokens_count_or_cumsum.npy": [[1, 2], [2, 2], [0, 0], [0, 0]],
               "f3/expanded_topk_weight.npy": First(4, np.array([[0.1], [0.6], [0.4], [0.5]], np.float32))}),
        (_Q2, {"q/expanded_x.npy": np.array([[2, -1, 1, 127, -2]], np.int8)}),
    ],
    ("docs/moe_finalize_routing.md", "# out [N, H] from the row-layout expert outputs"): [
        # bf16 expert outputs and residual, float32 weights, as the comment says.
        ({**_COMBINE, "ex.npy": _bf16(_COMBINE["ex.npy"]), "residual.npy": _bf16([[10], [20]])},
         {"out.npy": _bf16([[12], [25]])}),
        # V1: column layout (entry t*N + i), bias [E, H] added per pair's expert.
        ({**_COMBINE, "r.npy": np.array([1, 0, 3, 2], np.int32),
          "x1.npy": np.array([[10], [20]], np.float32), "b.npy": np.array([[0.5], [1]], np.float32),
          "e.npy": np.array([[0, 1], [1, 0]], np.int32)},
         {"out.npy": np.array([[10 + 0.5 * 2.5 + 0.25 * 5], [20 + 2 * 2 + 1 * 3.5]], np.float32)}),
        # grad_y = 1: a row's gradient is its pair's weight, a weight's gradient its pair's row.
        ({**_COMBINE, "gy.npy": np.ones((2, 1), np.float32)},
         {"out/grad_expanded_x.npy": np.array([[2], [0.5], [1], [0.25]], np.float32),
          "out/grad_scales.npy": np.array([[2, 4], [1, 3]], np.float32)}),
    ],
}


# ---------------------------------------------------------------------------------------------
# c, cpp: per block, SETUP in main() before it and CHECK after it.
# ---------------------------------------------------------------------------------------------
_C_COMBINE_SETUP = """
    /* The spec's combine example (N = 2, K = 2, H = 1) in float32. */
    float ex_host[4] = {1, 2, 3, 4}, scales_host[4] = {0.5f, 0.25f, 2, 1}, x1_host[2] = {10, 20};
    float out_host[2] = {-1, -1};
    int32_t idx_host[4] = {1, 3, 0, 2};
    const int64_t rows_shape[2] = {4, 1}, idx_shape[1] = {4}, scales_shape[2] = {2, 2},
                  tokens_shape[2] = {2, 1};
    mrTensor *ex, *idx, *x1, *scales, *out;
    uint64_t ws = 1;
    mrExecutor* exe = NULL;
    mrCreateTensor(rows_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, ex_host, &ex);
    mrCreateTensor(idx_shape, 1, MR_INT32, MR_DEVICE_CPU, idx_host, &idx);
    mrCreateTensor(tokens_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, x1_host, &x1);
    mrCreateTensor(scales_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, scales_host, &scales);
    mrCreateTensor(tokens_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, out_host, &out);
"""

C_BLOCKS = {
    # The seed example of README.md: expanded_row_idx [4, 1, 5, 3, 0, 2], K = 2; row r of grad
    # holds r, so grad_x's rows are 4 + 1, 5 + 3, 0 + 2.
    ("README.md", "#include <iostream>\n#include <moe_routing/moe_routing.hpp>"): ("""
        const int64_t H = 3;
        std::vector<float> grad(6 * H), grad_x(3 * H, -1.0f);
        for (int64_t r = 0; r < 6; ++r)
          for (int64_t j = 0; j < H; ++j) grad[r * H + j] = static_cast<float>(r);
        std::vector<int32_t> idx = {4, 1, 5, 3, 0, 2};
        """, """
        if (!s.is_ok()) return 1;
        const float expected[3] = {5, 8, 2};
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < H; ++j)
            if (grad_x[i * H + j] != expected[i]) return 2;
        """),
    # The spec's combine example in bf16 (1, 2, 3, 4 -> 0x3f80, 0x4000, 0x4040, 0x4080): out
    # {12, 25}; with grad_out 1 the rows' gradients are their pairs' weights and the weights'
    # gradients their pairs' rows.
    ("docs/moe_finalize_routing.md", "#include <moe_routing/moe_routing.hpp>"): ("""
        const int64_t N = 2, K = 2, H = 1;
        uint16_t expanded_x[4] = {0x3f80, 0x4000, 0x4040, 0x4080}, residual[2] = {0x4120, 0x41a0};
        int32_t expanded_row_idx[4] = {1, 3, 0, 2};
        float topk_weights[4] = {0.5f, 0.25f, 2, 1};
        uint16_t out[2] = {0, 0}, grad_out[2] = {0x3f80, 0x3f80}, grad_expanded_x[4] = {0, 0, 0, 0};
        float grad_scales[4] = {-1, -1, -1, -1};
        """, """
        const uint16_t want_out[2] = {0x4140, 0x41c8};
        const uint16_t want_gx[4] = {0x4000, 0x3f00, 0x3f80, 0x3e80};
        const float want_gs[4] = {2, 4, 1, 3};
        for (int i = 0; i < 2; ++i) if (out[i] != want_out[i]) return 1;
        for (int i = 0; i < 4; ++i) if (grad_expanded_x[i] != want_gx[i]) return 2;
        for (int i = 0; i < 4; ++i) if (grad_scales[i] != want_gs[i]) return 3;
        """),
    # G1 (docs/spec/moe_init_routing.md 1.10) with the Ascend 950's sequential order.
    ("docs/c_api.md", "mrTensor *g, *idx, *out;"): ("""
        const int64_t g_shape[2] = {6, 2}, idx_shape[1] = {6};
        float g_host[12] = {-1, 0.5f, 0.5f, 0.5f, 0x1p-30f, 0.25f, 0.125f, 2, 1, 3, 0.25f, -1};
        int32_t idx_host[6] = {4, 0, 2, 1, 5, 3};
        float out_host[4] = {-1, -1, -1, -1};
        """, """
        const float want[4] = {0x1p-30f, 3.75f, 0.875f, 1.5f};
        if (memcmp(out_host, want, sizeof want) != 0) return 1;
        """),
    # F1 (docs/spec/moe_init_routing.md 2.6), active_num 3 with the cumsum.
    ("docs/c_api.md", "mrMoeInitRoutingV2GetWorkspaceSize(x, expert_idx,"): ("""
        float x_host[6] = {1, 1.5f, 2, 2.5f, 3, 3.5f}, expanded_x_host[6];
        int32_t expert_idx_host[6] = {1, 0, 2, 1, 0, 2}, expanded_row_idx_host[6], cumsum_host[3];
        const int64_t two_by_two[2] = {3, 2}, pairs[1] = {6}, experts[1] = {3};
        mrTensor *x, *expert_idx, *expanded_x, *expanded_row_idx, *cumsum;
        mrExecutor* executor = NULL;
        uint64_t workspace_size = 0;
        void* workspace = NULL;
        memset(expanded_x_host, 0x7f, sizeof expanded_x_host);
        mrCreateTensor(two_by_two, 2, MR_FLOAT32, MR_DEVICE_CPU, x_host, &x);
        mrCreateTensor(two_by_two, 2, MR_INT32, MR_DEVICE_CPU, expert_idx_host, &expert_idx);
        mrCreateTensor(two_by_two, 2, MR_FLOAT32, MR_DEVICE_CPU, expanded_x_host, &expanded_x);
        mrCreateTensor(pairs, 1, MR_INT32, MR_DEVICE_CPU, expanded_row_idx_host, &expanded_row_idx);
        mrCreateTensor(experts, 1, MR_INT32, MR_DEVICE_CPU, cumsum_host, &cumsum);
        """, """
        const float want_x[6] = {1, 1.5f, 3, 3.5f, 1, 1.5f};
        const int32_t want_idx[6] = {2, 0, 4, 3, 1, 5}, want_cumsum[3] = {2, 4, 6};
        if (memcmp(expanded_x_host, want_x, sizeof want_x) != 0) return 1;
        if (memcmp(expanded_row_idx_host, want_idx, sizeof want_idx) != 0) return 2;
        if (memcmp(cumsum_host, want_cumsum, sizeof want_cumsum) != 0) return 3;
        free(workspace);
        """),
    ("docs/c_api.md", "/* The spec's combine example: mode 2"): ("", """
        if (out[0] != 12 || out[1] != 25) return 1;
        """),
    ("docs/moe_finalize_routing.md", "/* The spec's example: mode 2"): (_C_COMBINE_SETUP, """
        if (out_host[0] != 12 || out_host[1] != 25) return 1;
        """),
}


# ---------------------------------------------------------------------------------------------
# Reading the blocks
# ---------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^( *)```(\w*)\s*$")


def doc_blocks():
    """(file, line of the first code line, language, code) of every fenced block with a language."""
    blocks = []
    for path in DOC_FILES:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            lines = f.read().splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if m:
                indent, lang = len(m.group(1)), m.group(2)
                end = i + 1
                while not re.match(r"^ *```\s*$", lines[end]):
                    end += 1
                if lang:
                    code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
                    blocks.append((path, i + 2, lang, code))
                i = end
            i += 1
    return blocks


def is_covered(lang, code):
    return lang in ("python", "c", "cpp") or (lang == "sh" and re.search(r"^\s*(build/)?moe-routing ", code, re.M))


def find(name, blocks=None):
    """The one block that `name` (file, start of the first line) names."""
    path, first = name
    found = [b for b in (blocks or doc_blocks()) if b[0] == path and b[3].lstrip("\n").startswith(first)]
    assert len(found) == 1, f"{path}: {len(found)} blocks start with {first!r}, expected one"
    return found[0]


def key_in(table, block):
    """The key of `table` that names `block` (its file, and the start of its first line), or None."""
    for name in table:
        if name[0] == block[0] and block[3].lstrip("\n").startswith(name[1]):
            return name
    return None


def name_of(block):
    for table in (EXCLUDED, SETUP, CHECK, SH_BLOCKS, C_BLOCKS):
        name = key_in(table, block)
        if name is not None:
            return name
    return None


def test_every_block_is_run_or_excluded():
    blocks = doc_blocks()
    for table in (EXCLUDED, SETUP, CHECK, SH_BLOCKS, C_BLOCKS):
        for name in table:
            find(name, blocks)
    for path, line, lang, code in blocks:
        # A block tagged otherwise (bash, console, py, ...) would be neither run nor listed.
        assert lang in ("python", "c", "cpp", "sh"), \
            f"{path}:{line}: a block tagged {lang!r}; tag examples python, c, cpp or sh (or teach this test the tag)"
        if not is_covered(lang, code):
            continue
        name = name_of((path, line, lang, code))
        where = f"{path}:{line} ({lang}, {code.splitlines()[0]!r})"
        if name in EXCLUDED:
            continue
        if lang == "python":
            assert path in PYTHON_FILES, f"{where}: add {path} to PYTHON_FILES or the block to EXCLUDED"
        elif lang == "sh":
            assert name in SH_BLOCKS, f"{where}: give its commands inputs in SH_BLOCKS, or exclude it"
        else:
            assert name in C_BLOCKS, f"{where}: give it SETUP and CHECK in C_BLOCKS, or exclude it"
    for path in PYTHON_FILES:
        assert any(b[0] == path and b[2] == "python" and name_of(b) not in EXCLUDED for b in blocks), \
            f"{path} has no python block to run any more: remove it from PYTHON_FILES"


# ---------------------------------------------------------------------------------------------
# python
# ---------------------------------------------------------------------------------------------
_DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, code in json.load(open(sys.argv[1])):
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
    print(f"== ran {path}:{line}", flush=True)
"""


@pytest.mark.parametrize("path", PYTHON_FILES)
def test_python_blocks_run(path, tmp_path):
    pieces = []
    for block in doc_blocks():
        if block[0] != path or block[2] != "python" or key_in(EXCLUDED, block) is not None:
            continue
        setup, check = key_in(SETUP, block), key_in(CHECK, block)  # each table's own key for the block
        if setup is not None:
            pieces.append((f"<SETUP of {path}:{block[1]}>", 1, textwrap.dedent(SETUP[setup])))
        pieces.append((block[0], block[1], block[3]))
        if check is not None:
            pieces.append((f"<CHECK of {path}:{block[1]}>", 1, textwrap.dedent(CHECK[check])))
    assert pieces, f"{path}: no python block"
    (tmp_path / "blocks.json").write_text(json.dumps(pieces))
    (tmp_path / "driver.py").write_text(_DRIVER)
    done = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{path}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.count("== ran ") == len(pieces), done.stdout


# ---------------------------------------------------------------------------------------------
# sh
# ---------------------------------------------------------------------------------------------
def sh_commands(code):
    joined = code.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", list(SH_BLOCKS), ids=lambda n: f"{n[0]}:{n[1].splitlines()[0][:30]}")
def test_sh_block_runs(name, tmp_path):
    assert os.access(CLI, os.X_OK), f"{CLI} missing: `make build` first (or set MOE_ROUTING_CLI)"
    path, line, _, code = find(name)
    commands = sh_commands(code)
    runs = SH_BLOCKS[name]
    assert len(commands) == len(runs), f"{path}:{line}: {len(commands)} commands, inputs for {len(runs)}"
    for number, (command, (inputs, outputs)) in enumerate(zip(commands, runs)):
        assert command[0] in ("moe-routing", "build/moe-routing"), command
        work = tmp_path / f"command{number}"
        work.mkdir()
        for file, array in inputs.items():
            np.save(work / file, array)
        done = subprocess.run([CLI, *command[1:]], cwd=work, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{path}:{line}: {shlex.join(command)}\n{done.stderr}"
        for file, expected in outputs.items():
            got = np.load(work / file)
            if isinstance(expected, First):
                got, expected = got[:expected.rows], expected.values
            if isinstance(expected, np.ndarray):
                assert got.dtype == expected.dtype, f"{path}:{line}: {file} is {got.dtype}, expected {expected.dtype}"
            expected = np.asarray(expected)
            assert got.shape == expected.shape and np.array_equal(got, expected.astype(got.dtype)), \
                f"{path}:{line}: {shlex.join(command)}: {file} is\n{got!r}\nexpected\n{expected!r}"


# ---------------------------------------------------------------------------------------------
# c, cpp
# ---------------------------------------------------------------------------------------------
_PRELUDE = {
    "c": "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
         "#include <moe_routing/moe_routing.h>\n",
    "cpp": "#include <cstdint>\n#include <cstring>\n#include <vector>\n",
}


def compile_and_run(lang, program, tmp_path):
    library = os.path.join(BUILD_DIR, "libmoe_routing.a")
    assert os.path.isfile(library), f"{library} missing: `make build` first (or set MOE_ROUTING_CLI)"
    source = tmp_path / f"example.{lang}"
    source.write_text(program)
    if lang == "c":
        compiler = shlex.split(os.environ.get("CC", "cc"))
        flags = ["-std=c99", "-pedantic"]
        libs = ["-lstdc++", "-lpthread"]
    else:
        compiler = shlex.split(os.environ.get("CXX", "c++"))
        flags = ["-std=c++17"]
        libs = ["-lpthread"]
    assert compiler and shutil.which(compiler[0]), f"no {lang} compiler {compiler} (set CC / CXX)"
    built = subprocess.run([*compiler, *flags, "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
                            str(source), library, *libs, "-o", str(tmp_path / "example")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, f"compile failed:\n{built.stderr}\n--- program:\n{program}"
    return subprocess.run([str(tmp_path / "example")], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", list(C_BLOCKS), ids=lambda n: f"{n[0]}:{n[1].splitlines()[0][:30]}")
def test_c_block_compiles_and_runs(name, tmp_path):
    path, line, lang, code = find(name)
    setup, check = C_BLOCKS[name]
    lines = code.splitlines()
    at_file_scope = [l.startswith(("#include", "using namespace")) for l in lines]
    top = [l for l, scope in zip(lines, at_file_scope) if scope]
    body = ["" if scope else l for l, scope in zip(lines, at_file_scope)]   # keeps the line numbers
    program = (_PRELUDE[lang] + "\n".join(top) + "\n\nint main(void) {\n" + textwrap.dedent(setup)
               + f'#line {line} "{path}"\n' + "\n".join(body) + "\n"
               + textwrap.dedent(check) + "return 0;\n}\n")
    ran = compile_and_run(lang, program, tmp_path)
    assert ran.returncode == 0, f"{path}:{line}: exit status {ran.returncode}\n{ran.stdout}{ran.stderr}\n{program}"
