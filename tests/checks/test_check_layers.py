#!/usr/bin/env python3
"""tools/checks/check_layers.py on fake source trees: it passes a tree that follows the layers and
fails, naming file, line and rule, on each kind of violation. Run by ctest (checks.layers_checker)
with the Python standard library only."""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "checks",
                       "check_layers.py")

# A tree that follows the rules: each layer includes the one below it, plus a system header.
CLEAN = {
    "include/moe_routing/api.h": "#pragma once\n#include <cstdint>\n",
    "src/core/util.h": '#pragma once\n#include "moe_routing/api.h"\n',
    "src/params/problem.h": '#pragma once\n#include "core/util.h"\n',
    "src/cpu/kernel.h": '#pragma once\n#include "params/problem.h"\n',
    "src/cpu/kernel.cpp": '#include "cpu/kernel.h"\n#include "kernel.h"\n',
    "src/reference/ref.cpp": '#include "params/problem.h"\n',
    "src/ops/op/dispatch.cpp": '#include "cpu/kernel.h"\n#include "reference/ref.cpp"\n',
    "src/c_api/c_api.cpp": '#include "ops/op/dispatch.cpp"\n',
    "tools/cli/cli.cpp": '#include "commands.h"\n#include "cpu/kernel.h"\n#include "cases/cases.h"\n',
    "tools/cases/cases.h": '#pragma once\n#include "moe_routing/api.h"\n#include "random.h"\n',
    "tools/cases/random.h": "#pragma once\n#include <cstdint>\n",
    "tools/cli/commands.h": '#pragma once\n#include <moe_routing/api.h>\n',
    "python/moe_routing/csrc/ops.cpp": '#include "moe_routing/api.h"\n',
}


def run_checker(files):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        result = subprocess.run([sys.executable, CHECKER, "--root", root], capture_output=True,
                                text=True)
    return result.returncode, result.stdout + result.stderr


class CheckLayersTest(unittest.TestCase):
    def assert_fails(self, files, *expected):
        code, output = run_checker(files)
        self.assertEqual(code, 1, output)
        for text in expected:
            self.assertIn(text, output)

    def test_a_tree_that_follows_the_layers_passes(self):
        code, output = run_checker(CLEAN)
        self.assertEqual(code, 0, output)
        self.assertIn("follow the layers", output)

    def test_a_lower_layer_including_a_higher_one_fails(self):
        files = dict(CLEAN)
        files["src/core/util.h"] = '#pragma once\n// why\n#include "ops/op/dispatch.cpp"\n'
        self.assert_fails(files, "src/core/util.h:3:", '#include "ops/op/dispatch.cpp"',
                          "layer 'core' (rank 1) may not include layer 'ops' (rank 4)")

    def test_a_public_header_including_src_fails(self):
        files = dict(CLEAN)
        files["include/moe_routing/api.h"] = '#pragma once\n#include "core/util.h"\n'
        self.assert_fails(files, "include/moe_routing/api.h:2:",
                          "layer 'public header' (rank 0) may not include layer 'core' (rank 1)")

    def test_params_including_a_backend_fails(self):
        files = dict(CLEAN)
        files["src/params/problem.h"] = '#pragma once\n#include <cpu/kernel.h>\n'
        self.assert_fails(files, "src/params/problem.h:2:", "#include <cpu/kernel.h>",
                          "layer 'params' (rank 2) may not include layer 'backend cpu' (rank 3)")

    def test_a_conditional_include_counts(self):
        files = dict(CLEAN)
        files["src/cpu/kernel.cpp"] = ('#include "cpu/kernel.h"\n#if defined(X)\n'
                                       '  #  include "ops/op/dispatch.cpp"\n#endif\n')
        self.assert_fails(files, "src/cpu/kernel.cpp:3:")

    def test_backends_do_not_include_each_other(self):
        files = dict(CLEAN)
        files["src/cuda/backend.h"] = '#pragma once\n#include "cpu/kernel.h"\n'
        self.assert_fails(files, "src/cuda/backend.h:2:",
                          "layer 'backend cuda' may not include layer 'backend cpu'")

    def test_front_ends_do_not_include_each_other(self):
        files = dict(CLEAN)
        files["python/moe_routing/csrc/ops.cpp"] = '#include "c_api/c_api.cpp"\n'
        self.assert_fails(files, "python/moe_routing/csrc/ops.cpp:1:",
                          "layer 'front end torch binding' may not include layer 'front end c_api'")

    def test_the_test_cases_include_public_headers_only(self):
        files = dict(CLEAN)
        files["tools/cases/cases.h"] = '#pragma once\n#include "ops/op/dispatch.cpp"\n'
        self.assert_fails(files, "tools/cases/cases.h:2:",
                          "layer 'test cases' may include only layers of rank 0 or lower, got "
                          "layer 'ops' (rank 4)")

    def test_the_test_cases_include_no_front_end(self):
        files = dict(CLEAN)
        files["tools/cases/cases.h"] = '#pragma once\n#include "cli/commands.h"\n'
        self.assert_fails(files, "tools/cases/cases.h:2:", "layer 'test cases' may include only")

    def test_the_library_does_not_include_the_test_cases(self):
        files = dict(CLEAN)
        files["src/ops/op/dispatch.cpp"] = '#include "cases/cases.h"\n'
        self.assert_fails(files, "src/ops/op/dispatch.cpp:1:",
                          "layer 'ops' (rank 4) may not include layer 'test cases' (rank 5)")

    def test_a_quoted_include_must_name_a_project_file(self):
        files = dict(CLEAN)
        files["src/ops/op/dispatch.cpp"] = '#include "cpu/missing.h"\n'
        self.assert_fails(files, "src/ops/op/dispatch.cpp:1:",
                          '#include "cpu/missing.h" names no file of the project')

    def test_a_file_outside_every_layer_fails(self):
        files = dict(CLEAN)
        files["src/misc/helper.h"] = "#pragma once\n"
        self.assert_fails(files, "src/misc/helper.h:0:", "file is in no layer")

    def test_every_violation_is_reported(self):
        files = dict(CLEAN)
        files["src/core/util.h"] = ('#pragma once\n#include "cpu/kernel.h"\n'
                                    '#include "ops/op/dispatch.cpp"\n')
        self.assert_fails(files, "src/core/util.h:2:", "src/core/util.h:3:", "2 violation(s)")


if __name__ == "__main__":
    unittest.main()
