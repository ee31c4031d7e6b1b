#!/usr/bin/env bash
# Fails when a tracked C, C++ or CUDA file differs from what clang-format (.clang-format at the
# repository root) makes of it, and names each such file. `make format` applies the style.
set -euo pipefail
cd "$(dirname "$0")/../.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null || {
  echo "format_check: $CLANG_FORMAT must be installed (Debian package clang-format), got none" >&2
  exit 1
}
bad=()
while IFS= read -r -d '' f; do
  if ! "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done < <(git ls-files -z --cached --others --exclude-standard -- \
  '*.h' '*.hpp' '*.cpp' '*.c' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  echo "format_check: ${#bad[@]} file(s) are not formatted with .clang-format (run 'make format'):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format_check: every C/C++/CUDA file follows .clang-format"
