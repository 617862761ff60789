// What two connectors say to each other (docs/connect.md has each field): the metadata of a
// readable or writable operation (RdmaMetadata), handed to the peer over any channel, and the
// messages of the "connect" channel of the agent (BEGIN, STARTED, DONE, CANCEL).
//
// Metadata is a capability: it names the owner (its agent address), the operation (a random
// 64-bit id), what the holder may do (READ from a readable, WRITE to a writable), the
// descriptors' sizes, and an expiry; a tag (HMAC-SHA256 under a key only the owner has) covers
// all of it. It carries no memory key: the owner moves the bytes itself, into or out of buffers
// the peer exposes for that one operation. Both decoders are strict (unknown members, wrong
// kinds, out-of-range numbers are refused) and fuzzed (tests/fuzz/connect_fuzz.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/connect/connector.h"

namespace ferry::connect {

inline constexpr int kMetadataVersion = 1;
inline constexpr size_t kMaxDescriptors = 65536;
inline constexpr size_t kMaxMetadataText = size_t{2} << 20;

struct DescriptorInfo {
  uint64_t size = 0;
  std::string device = "cpu";
  bool operator==(const DescriptorInfo&) const = default;
};

struct Metadata {
  int version = kMetadataVersion;
  OperationKind kind = OperationKind::kRead;  // what the holder may do
  std::string worker;                         // the owner's name (its agent's alias)
  std::string address;                        // the owner's agent address (bytes; hex in the text)
  uint64_t operation = 0;                     // the owner's operation id
  std::string nonce;                          // 32 hex digits
  int64_t expires = 0;                        // milliseconds since the epoch
  std::vector<DescriptorInfo> descriptors;
  std::string tag;  // 64 hex digits

  bool operator==(const Metadata&) const = default;
};

// The text the tag covers: every field but the tag, each length-prefixed, in a fixed order.
std::string canonicalText(const Metadata& m);
// The metadata as JSON text (RdmaMetadata's form).
std::string encodeMetadata(const Metadata& m);
// Parses metadata text. kInvalidArgument (saying what is wrong) for anything malformed.
Result<Metadata> decodeMetadata(std::string_view text);

// A buffer the active side exposes for one operation, on the device its endpoint uses.
struct BufferInfo {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  bool operator==(const BufferInfo&) const = default;
};

// BEGIN: active -> owner. STARTED: owner -> active, the BEGIN was accepted (the transfer runs; an
// active operation not STARTED by its metadata's expiry never will be). DONE: owner -> active, the
// end (or a refusal). CANCEL: active -> owner.
enum class MessageType : uint8_t { kBegin, kStarted, kDone, kCancel };

struct Message {
  MessageType type = MessageType::kBegin;
  uint64_t id = 0;                    // the active side's operation id
  Metadata metadata;                  // begin
  std::vector<BufferInfo> buffers;    // begin: one per descriptor, in order
  uint64_t operation = 0;             // cancel: the owner's operation id
  StatusCode code = StatusCode::kOk;  // done
  std::string reason;                 // done (when not OK)
};

std::string encodeMessage(const Message& m);
// kProtocolError for anything malformed.
Result<Message> decodeMessage(std::string_view text);

}  // namespace ferry::connect
