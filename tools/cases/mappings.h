// What Linux reports about the memory mapping that holds an address (/proc/self/smaps), for the
// tests and the bench that check or measure huge pages.
#pragma once

#include <string>

namespace moe_routing::cases {

/// The value of `field` ("VmFlags", "AnonHugePages", ...) of the mapping of /proc/self/smaps that
/// holds `address`: the text after "field:", without the blanks around it; "" where there is none
/// (not Linux, no such mapping or field).
std::string smaps_field(const void* address, const char* field);

}  // namespace moe_routing::cases
