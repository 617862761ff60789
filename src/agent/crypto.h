// Small cryptographic helpers of the agent and the layers above it (OpenSSL underneath): hex text,
// HMAC-SHA256, comparisons that take the same time whatever differs, random nonces.
#pragma once

#include <string>
#include <string_view>

namespace ferry::agent {

// Lower-case hex of bytes, and back (false for odd lengths or other characters).
std::string hexOf(std::string_view bytes);
bool unhexInto(std::string_view text, std::string* out);
// HMAC-SHA256 of text under key, as 64 hex digits.
std::string hmacSha256Hex(std::string_view key, std::string_view text);
// Whether a == b, in time that depends on their length only.
bool constantTimeEqual(std::string_view a, std::string_view b);
// n random bytes from the kernel (std::random_device), as 2n hex digits.
std::string randomHex(size_t n);

}  // namespace ferry::agent
