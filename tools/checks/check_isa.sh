#!/usr/bin/env bash
# Proves, on built object files, that the baseline path of the library cannot execute an AVX
# instruction:
#  1. no baseline object contains a VEX- or EVEX-encoded instruction (objdump -d: their mnemonics
#     start with 'v', and only they use ymm/zmm registers);
#  2. no baseline object defines a code symbol (global or weak) that an AVX2 object also defines.
#     Where both define one (an inline function or template instance emitted out of line), the
#     linker keeps one copy for every caller, possibly the AVX2-compiled one for the baseline path:
#     SIGILL on a CPU without AVX2. Per-ISA namespaces (moe_routing::cpu::baseline / ::avx2) keep
#     the sets apart; this check notices when something slips through.
# An emulator cannot prove this (QEMU's user mode executes AVX2 even under -cpu Nehalem).
#
# Usage: check_isa.sh --baseline OBJ... [--avx2 OBJ...]
# Lists may also come as one ';'-separated argument (CMake's $<TARGET_OBJECTS:...>). Exits 1,
# naming the object, function and instruction or symbol, on any finding; 0 otherwise.
set -euo pipefail

OBJDUMP=${OBJDUMP:-objdump}
NM=${NM:-nm}
for tool in "$OBJDUMP" "$NM"; do
  command -v "$tool" >/dev/null || {
    echo "check_isa: $tool must be installed (Debian package binutils), got none" >&2
    exit 1
  }
done

baseline=()
avx2=()
list=""
for arg in "$@"; do
  case "$arg" in
    --baseline) list=baseline ;;
    --avx2) list=avx2 ;;
    *)
      [ -n "$list" ] || { echo "check_isa: usage: check_isa.sh --baseline OBJ... [--avx2 OBJ...], got '$arg' first" >&2; exit 1; }
      IFS=';' read -r -a items <<<"$arg"
      for item in "${items[@]}"; do
        [ -n "$item" ] || continue
        [ -f "$item" ] || { echo "check_isa: object file must exist, got '$item'" >&2; exit 1; }
        if [ "$list" = baseline ]; then baseline+=("$item"); else avx2+=("$item"); fi
      done
      ;;
  esac
done
[ ${#baseline[@]} -gt 0 ] || { echo "check_isa: at least one baseline object must be given, got none" >&2; exit 1; }

failures=0

# 1. VEX/EVEX instructions in baseline objects. The mnemonic is the first word after the address;
#    the VMX/SVM instructions (vmcall, vmxon, verr, ...) also start with 'v' but are not VEX.
for object in "${baseline[@]}"; do
  found=$("$OBJDUMP" -d -C --no-show-raw-insn "$object" | awk '
    /^[0-9a-f]+ <.*>:$/ { function_name = substr($0, index($0, " ") + 1); next }
    /^ *[0-9a-f]+:\t/ {
      split($0, parts, "\t"); instruction = parts[2]; split(instruction, words, " ");
      mnemonic = words[1];
      if (mnemonic ~ /^\{(vex|vex3|evex)\}/ ||
          (mnemonic ~ /^v/ && mnemonic !~ /^(verr|verw|vmcall|vmclear|vmfunc|vmlaunch|vmptrld|vmptrst|vmread|vmresume|vmwrite|vmxoff|vmxon|vmrun|vmload|vmsave|vmmcall)/) ||
          instruction ~ /%[yz]mm/) {
        if (++n <= 5) print "  in " function_name " " instruction
      }
    }
    END { if (n > 5) print "  ... " n - 5 " more" }')
  if [ -n "$found" ]; then
    echo "check_isa: $object is a baseline object but contains VEX/EVEX (AVX) instructions, e.g.:" >&2
    echo "$found" >&2
    failures=$((failures + 1))
  fi
done

# 2. Code symbols defined by a baseline object and an AVX2 object alike (T: global text, W: weak,
#    i: indirect function; data symbols such as DW.ref.__gxx_personality_v0 hold no instructions).
code_symbols() { "$NM" --defined-only -g "$@" 2>/dev/null | awk '$2 ~ /^[TWi]$/ { print $3 }' | sort -u; }
if [ ${#avx2[@]} -gt 0 ]; then
  shared=$(comm -12 <(code_symbols "${baseline[@]}") <(code_symbols "${avx2[@]}"))
  if [ -n "$shared" ]; then
    echo "check_isa: baseline and AVX2 objects define the same code symbols (the linker may keep the" >&2
    echo "AVX2 copy for the baseline path); put the per-ISA code in its ISA's namespace:" >&2
    while IFS= read -r symbol; do
      echo "  $symbol ($(printf '%s\n' "$symbol" | c++filt))" >&2
    done <<<"$shared"
    failures=$((failures + 1))
  fi
fi

if [ $failures -gt 0 ]; then exit 1; fi
echo "check_isa: ${#baseline[@]} baseline object(s) hold no AVX instruction and share no code symbol with ${#avx2[@]} AVX2 object(s)"
