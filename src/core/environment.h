// The one reading of the library's numeric environment variables (MOE_ROUTING_NUM_THREADS,
// MOE_ROUTING_OUTPUT_CACHE_MB, MOE_ROUTING_HUGE_PAGES), so that they accept the same text.
#pragma once

#include <cstdint>

namespace moe_routing::detail {

/// A variable's value as a whole decimal number: an optional sign, digits, surrounding spaces and
/// tabs allowed, nothing else (no hex, no exponent, no suffix). `valid` is false for anything
/// else, nullptr (unset) included. A number beyond int64_t saturates to INT64_MIN / INT64_MAX.
struct EnvNumber {
  bool valid = false;
  int64_t value = 0;
};
EnvNumber parse_env_number(const char* text);

/// Writes one line to stderr: `moe_routing: <name> must be <constraint>, got "<text>"; using
/// <instead>`. What a variable whose value is ignored says (the library cannot fail at the first
/// use of a setting, and a silently ignored value would hide the mistake).
void warn_env_ignored(const char* name, const char* constraint, const char* text,
                      const char* instead);

}  // namespace moe_routing::detail
