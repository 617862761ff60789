// Base64 (RFC 4648, the standard alphabet with '=' padding): how ferry carries bytes inside JSON
// text (the ferry:// store's values, etcd's keys and values).
//
// decodeBase64 is strict, because it reads what a peer sent: the length must be a multiple of 4,
// only the alphabet and trailing padding are accepted, and the unused bits of the last character
// must be zero, so every byte string has exactly one encoding that decodes.
#pragma once

#include <string>
#include <string_view>

#include "ferry/common/status.h"

namespace ferry {

std::string encodeBase64(std::string_view bytes);
// kInvalidArgument naming the first offending offset for anything that encodeBase64 would not
// have produced.
Result<std::string> decodeBase64(std::string_view text);

}  // namespace ferry
