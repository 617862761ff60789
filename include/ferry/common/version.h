// ferry's version, the one number CMakeLists.txt's project() declares (the Python package's
// metadata reads it from there too).
#pragma once

namespace ferry {

// "MAJOR.MINOR.PATCH", e.g. "0.1.0".
const char* version();

}  // namespace ferry
