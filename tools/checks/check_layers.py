#!/usr/bin/env python3
"""Checks that #include edges follow the one-way layers of docs/ARCHITECTURE.md.

Every C, C++ and CUDA file under include/, src/, the front ends (tools/cli/,
python/moe_routing/csrc/) and the test cases (tools/cases/) is read; each of its #include lines
(conditional ones too) that names a file of the project is checked against the layer of the
including file:

  rank 0  include/moe_routing/        public headers
  rank 1  src/core/                   core
  rank 2  src/params/                 operator definitions the kernels need
  rank 3  src/reference/, src/cpu/, src/cuda/   backends
  rank 4  src/ops/                    operator entry points
  rank 5  src/c_api/, tools/cli/, python/moe_routing/csrc/   front ends
  rank 5  tools/cases/                test cases (beside the front ends, built on rank 0 only)

A file may include files of its own rank or a lower one, never a higher one; a backend or a front
end may not include another backend or front end. The test cases are no front end: a front end
may include them, and they include public headers only. A quoted include must name a file of the
project (resolved against the including file's folder, then include/, src/ and tools/), and every
file under src/ must sit in a folder of some layer. Each violation is printed as `path:line: rule`; the exit status
is 1 when there is any, 0 otherwise.

Usage: check_layers.py [--root DIR]   (default: the repository holding this script)
"""

import argparse
import os
import re
import sys

EXTENSIONS = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")
SCANNED = ("include", "src", "tools/cli", "tools/cases", "python/moe_routing/csrc")
INCLUDE_ROOTS = ("include", "src", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')

# (path prefix, layer name, rank, component). Components of the same rank must not include each
# other where `exclusive` (backends, front ends).
LAYERS = (
    ("include/moe_routing/", "public header", 0, "public"),
    ("src/core/", "core", 1, "core"),
    ("src/params/", "params", 2, "params"),
    ("src/reference/", "backend reference", 3, "reference"),
    ("src/cpu/", "backend cpu", 3, "cpu"),
    ("src/cuda/", "backend cuda", 3, "cuda"),
    ("src/ops/", "ops", 4, "ops"),
    ("src/c_api/", "front end c_api", 5, "c_api"),
    ("tools/cli/", "front end cli", 5, "cli"),
    ("python/moe_routing/csrc/", "front end torch binding", 5, "torch"),
    ("tools/cases/", "test cases", 5, "cases"),
)
EXCLUSIVE_RANKS = (3, 5)
# Libraries at a rank of their own that are no backend or front end: any component of that rank
# may include them, and they may include nothing above the given rank (but themselves).
SHARED = {"cases": 0}


def layer_of(path):
    for prefix, name, rank, component in LAYERS:
        if path.startswith(prefix):
            return name, rank, component
    return None


def source_files(root):
    for top in SCANNED:
        base = os.path.join(root, top)
        for folder, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")


def resolve(root, including, kind, target):
    """The project-relative path an include names, or None when it is not a project file."""
    candidates = []
    if kind == '"':
        candidates.append(os.path.join(os.path.dirname(including), target))
    candidates.extend(os.path.join(r, target) for r in INCLUDE_ROOTS)
    for candidate in candidates:
        if os.path.isfile(os.path.join(root, candidate)):
            return os.path.normpath(candidate).replace(os.sep, "/")
    return None


def check(root):
    """Returns (violations, files, includes); a violation is (path, line, message)."""
    violations = []
    files = includes = 0
    for path in source_files(root):
        files += 1
        source = layer_of(path)
        if source is None:
            violations.append((path, 0, "file is in no layer: put it in a folder that "
                               "docs/ARCHITECTURE.md assigns one (or add the folder to "
                               "tools/checks/check_layers.py and the document)"))
            continue
        name, rank, component = source
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, text in enumerate(f, 1):
                match = INCLUDE.match(text)
                if not match:
                    continue
                kind, target = match.groups()
                includes += 1
                resolved = resolve(root, path, kind, target)
                spelled = '#include %s%s%s' % (kind, target, '"' if kind == '"' else ">")
                if resolved is None:
                    if kind == '"':
                        violations.append((path, number, "%s names no file of the project (quoted "
                                           "includes are for project files)" % spelled))
                    continue
                included = layer_of(resolved)
                if included is None:
                    violations.append((path, number, "%s names %s, which is in no layer"
                                       % (spelled, resolved)))
                    continue
                other_name, other_rank, other_component = included
                if other_rank > rank:
                    violations.append((path, number, "%s: layer '%s' (rank %d) may not include "
                                       "layer '%s' (rank %d): includes go to the same or a lower "
                                       "layer" % (spelled, name, rank, other_name, other_rank)))
                elif (component in SHARED and other_component != component
                      and other_rank > SHARED[component]):
                    violations.append((path, number, "%s: layer '%s' may include only layers of "
                                       "rank %d or lower, got layer '%s' (rank %d)"
                                       % (spelled, name, SHARED[component], other_name,
                                          other_rank)))
                elif (other_rank == rank and rank in EXCLUSIVE_RANKS
                      and other_component != component and other_component not in SHARED):
                    violations.append((path, number, "%s: layer '%s' may not include layer '%s': "
                                       "backends and front ends do not include each other"
                                       % (spelled, name, other_name)))
    return violations, files, includes


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..", ".."))
    parser.add_argument("--root", default=default_root, help="repository root")
    args = parser.parse_args(argv)
    violations, files, includes = check(args.root)
    for path, line, message in violations:
        print("%s:%d: %s" % (path, line, message), file=sys.stderr)
    if violations:
        print("check_layers: %d violation(s) of the layers of docs/ARCHITECTURE.md in %d files"
              % (len(violations), files), file=sys.stderr)
        return 1
    print("check_layers: %d includes in %d files follow the layers of docs/ARCHITECTURE.md"
          % (includes, files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
