// A test helper: an environment variable set for a scope (POSIX setenv / unsetenv).
#pragma once

#include <cstdlib>
#include <string>

namespace moe_routing {

/// Sets an environment variable for a scope (nullptr: unset), restoring it after.
class EnvironmentVariable {
 public:
  EnvironmentVariable(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvironmentVariable() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace moe_routing
