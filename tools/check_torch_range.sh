#!/usr/bin/env bash
# Builds moe_routing against each given torch release and runs the Python suites with it: the
# check behind the supported range (pyproject.toml, python/moe_routing/_version_check.py), to be
# run when the range changes. Not part of `make test`: PyPI's torch for Linux x86_64 is a CUDA
# build that imports only with its CUDA libraries, about 5 GB installed per release, downloaded
# unless pip finds them on disk.
#
#   tools/check_torch_range.sh 2.12.1 2.15.0        (make check-torch-range TORCH_RELEASES="...")
#
# Each release gets a virtual environment and a build tree under $WORK (default
# build/torch-range/), removed after its run; the summary lists each release's pytest result.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${WORK:-$root/build/torch-range}
python=${PYTHON:-python3}
[ $# -gt 0 ] || { echo "usage: $0 TORCH_VERSION..." >&2; exit 2; }

mkdir -p "$work"
summary=()
status=0
for version in "$@"; do
  venv=$work/venv-$version
  build=$work/build-$version
  log=$work/$version.log
  echo "== torch $version: installing (log: $log)"
  rm -rf "$venv" "$build"
  "$python" -m venv "$venv"
  # PIP_CONSTRAINT: where a pip configuration caps torch's release, the release asked for wins.
  if ! PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q --no-compile \
      "torch==$version" numpy pytest scikit-build-core ninja > "$log" 2>&1; then
    summary+=("torch $version: could not be installed (see $log)"); status=1; continue
  fi
  echo "== torch $version: building moe_routing against it"
  if ! "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
      -C "build-dir=$build" . >> "$log" 2>&1; then
    summary+=("torch $version: the build failed (see $log)"); status=1; continue
  fi
  echo "== torch $version: tests/python and tests/adversarial/python"
  # test_bench_runs needs the command-line tool of a `make build`; it does not involve torch.
  result=$(cd tests/python && TORCHINDUCTOR_CACHE_DIR=$build/inductor-cache \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --ignore=test_bench_runs.py \
    . ../adversarial/python 2>&1 | tee -a "$log" | tail -1) || status=1
  summary+=("torch $version: $result")
  rm -rf "$venv" "$build"
done
printf '%s\n' "${summary[@]}"
exit $status
