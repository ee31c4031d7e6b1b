// The library's environment variables' one reading (core/environment.h).
#include "core/environment.h"

#include <cstdio>
#include <limits>

namespace moe_routing::detail {

EnvNumber parse_env_number(const char* text) {
  if (text == nullptr) return {};
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  const char* p = text;
  while (blank(*p)) ++p;
  const bool negative = *p == '-';
  if (*p == '-' || *p == '+') ++p;
  if (*p < '0' || *p > '9') return {};
  // Accumulated as a negative number so that INT64_MIN fits; saturates beyond.
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  int64_t value = 0;
  bool saturated = false;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const int digit = *p - '0';
    if (saturated || value < (kMin + digit) / 10)
      saturated = true;
    else
      value = value * 10 - digit;
  }
  while (blank(*p)) ++p;
  if (*p != '\0') return {};
  if (saturated) return {true, negative ? kMin : std::numeric_limits<int64_t>::max()};
  if (negative) return {true, value};
  return {true, value == kMin ? std::numeric_limits<int64_t>::max() : -value};
}

void warn_env_ignored(const char* name, const char* constraint, const char* text,
                      const char* instead) {
  std::fprintf(stderr, "moe_routing: %s must be %s, got \"%s\"; using %s\n", name, constraint, text,
               instead);
}

}  // namespace moe_routing::detail
