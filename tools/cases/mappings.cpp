#include "cases/mappings.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace moe_routing::cases {

std::string smaps_field(const void* address, const char* field) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  const std::string prefix = std::string(field) + ":";
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream header(line);
    // A mapping's first line is "lo-hi perms offset ..."; its fields follow as "Name: value".
    if (header >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind(prefix, 0) == 0) {
      const size_t begin = line.find_first_not_of(" \t", prefix.size());
      const size_t end = line.find_last_not_of(" \t");
      return begin == std::string::npos ? "" : line.substr(begin, end - begin + 1);
    }
  }
  return "";
}

}  // namespace moe_routing::cases
