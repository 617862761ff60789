#include "ferry/common/version.h"

namespace ferry {

const char* version() { return FERRY_VERSION_STRING; }

}  // namespace ferry
