// A libphos setting that is on unless its variable says 0 or off.
#pragma once

#include <cstdlib>
#include <cstring>

namespace phos::hooks {

inline bool on_unless_switched_off(const char* variable) {
  const char* v = std::getenv(variable);
  return !v || !(std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0);
}

}  // namespace phos::hooks
