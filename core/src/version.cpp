#include "dp/version.hpp"

namespace dp {
const char* version() { return DPRUN_VERSION_STRING; }
}  // namespace dp
