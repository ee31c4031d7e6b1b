#!/usr/bin/env bash
# Proves, on built object files, that the baseline path of the library cannot execute an AVX
# instruction, nor the AVX2 path an AVX-512 one:
#  1. no baseline object contains a VEX- or EVEX-encoded instruction (objdump -d: their mnemonics
#     start with 'v', and only they use ymm/zmm registers);
#  2. no AVX2 object contains an EVEX-encoded (AVX-512) instruction: one whose first byte is 0x62
#     (EVEX's escape; BOUND, its meaning outside 64-bit mode, does not exist there) or that uses a
#     zmm or opmask (k) register;
#  3. no two objects of different ISAs (baseline, AVX2, AVX-512) define the same code symbol
#     (global or weak). Where both define one (an inline function or template instance emitted out
#     of line), the linker keeps one copy for every caller, possibly the one compiled for the
#     higher ISA for the lower path: SIGILL on a CPU without it. Per-ISA namespaces
#     (moe_routing::cpu::baseline / ::avx2 / ::avx512) keep the sets apart; this check notices
#     when something slips through.
# An emulator cannot prove this (QEMU's user mode executes AVX2 even under -cpu Nehalem).
#
# Usage: check_isa.sh --baseline OBJ... [--avx2 OBJ...] [--avx512 OBJ...]
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
avx512=()
list=""
for arg in "$@"; do
  case "$arg" in
    --baseline) list=baseline ;;
    --avx2) list=avx2 ;;
    --avx512) list=avx512 ;;
    *)
      [ -n "$list" ] || { echo "check_isa: usage: check_isa.sh --baseline OBJ... [--avx2 OBJ...] [--avx512 OBJ...], got '$arg' first" >&2; exit 1; }
      IFS=';' read -r -a items <<<"$arg"
      for item in "${items[@]}"; do
        [ -n "$item" ] || continue
        [ -f "$item" ] || { echo "check_isa: object file must exist, got '$item'" >&2; exit 1; }
        case "$list" in
          baseline) baseline+=("$item") ;;
          avx2) avx2+=("$item") ;;
          avx512) avx512+=("$item") ;;
        esac
      done
      ;;
  esac
done
[ ${#baseline[@]} -gt 0 ] || { echo "check_isa: at least one baseline object must be given, got none" >&2; exit 1; }

failures=0

# 1. VEX/EVEX instructions in baseline objects. The mnemonic is the first word after the address;
#    the VMX/SVM instructions (vmcall, vmxon, verr, ...) also start with 'v' but are not VEX.
# find_instructions MODE OBJECT prints up to five "in <function> <instruction>" lines for the
# instructions MODE forbids: vex, any VEX or EVEX one; evex, any EVEX one. objdump shows the raw
# bytes (a long instruction's last bytes on a line of their own, without an instruction).
find_instructions() {
  "$OBJDUMP" -d -C "$2" | awk -v mode="$1" '
    /^[0-9a-f]+ <.*>:$/ { function_name = substr($0, index($0, " ") + 1); next }
    /^ *[0-9a-f]+:\t/ {
      split($0, parts, "\t"); bytes = parts[2]; instruction = parts[3];
      if (instruction == "") next;
      split(instruction, words, " "); mnemonic = words[1];
      evex = bytes ~ /^62 / || instruction ~ /%zmm|%k[0-7]|\{evex\}/;
      vex = mnemonic ~ /^\{(vex|vex3)\}/ ||
            (mnemonic ~ /^v/ && mnemonic !~ /^(verr|verw|vmcall|vmclear|vmfunc|vmlaunch|vmptrld|vmptrst|vmread|vmresume|vmwrite|vmxoff|vmxon|vmrun|vmload|vmsave|vmmcall)/) ||
            instruction ~ /%ymm/;
      if (mode == "vex" ? (vex || evex) : evex) {
        if (++n <= 5) print "  in " function_name " " instruction
      }
    }
    END { if (n > 5) print "  ... " n - 5 " more" }'
}

# check_objects MODE WHAT OBJECT...: reports each object holding an instruction MODE forbids.
check_objects() {
  local mode=$1 what=$2 object found
  shift 2
  for object in "$@"; do
    found=$(find_instructions "$mode" "$object")
    if [ -n "$found" ]; then
      echo "check_isa: $object is $what, e.g.:" >&2
      echo "$found" >&2
      failures=$((failures + 1))
    fi
  done
}

check_objects vex "a baseline object but contains VEX/EVEX (AVX) instructions" "${baseline[@]}"

# 2. EVEX (AVX-512) instructions in AVX2 objects, from the raw bytes as well as the operands.
check_objects evex "an AVX2 object but contains EVEX (AVX-512) instructions" ${avx2[@]+"${avx2[@]}"}

# 3. Code symbols defined by objects of two ISAs alike (T: global text, W: weak, i: indirect
#    function; data symbols such as DW.ref.__gxx_personality_v0 hold no instructions).
code_symbols() { "$NM" --defined-only -g "$@" 2>/dev/null | awk '$2 ~ /^[TWi]$/ { print $3 }' | sort -u; }
# shared_symbols LOW_NAME HIGH_NAME -- LOW_OBJ... -- HIGH_OBJ...
shared_symbols() {
  local low_name=$1 high_name=$2
  shift 3
  local low=() high=()
  while [ "$1" != "--" ]; do low+=("$1"); shift; done
  shift
  high=("$@")
  [ ${#low[@]} -gt 0 ] && [ ${#high[@]} -gt 0 ] || return 0
  local shared
  shared=$(comm -12 <(code_symbols "${low[@]}") <(code_symbols "${high[@]}"))
  if [ -n "$shared" ]; then
    echo "check_isa: $low_name and $high_name objects define the same code symbols (the linker may keep the" >&2
    echo "$high_name copy for the $low_name path); put the per-ISA code in its ISA's namespace:" >&2
    while IFS= read -r symbol; do
      echo "  $symbol ($(printf '%s\n' "$symbol" | c++filt))" >&2
    done <<<"$shared"
    failures=$((failures + 1))
  fi
}
shared_symbols baseline AVX2 -- ${baseline[@]+"${baseline[@]}"} -- ${avx2[@]+"${avx2[@]}"}
shared_symbols baseline AVX-512 -- ${baseline[@]+"${baseline[@]}"} -- ${avx512[@]+"${avx512[@]}"}
shared_symbols AVX2 AVX-512 -- ${avx2[@]+"${avx2[@]}"} -- ${avx512[@]+"${avx512[@]}"}

if [ $failures -gt 0 ]; then exit 1; fi
echo "check_isa: ${#baseline[@]} baseline object(s) hold no AVX instruction, ${#avx2[@]} AVX2 object(s) no AVX-512 one, and no code symbol is shared with ${#avx2[@]} AVX2 and ${#avx512[@]} AVX-512 object(s)"
