// Assignments and chunks: what one transfer range of a batch is, in ferry's Endpoint API.
//
// An Assignment names both ends of a one-sided transfer with fields that do not change meaning
// between READ and WRITE:
//
//   ferry::endpoint::Assignment a{.local = kv, .remote = remoteKv,
//                                 .localOffset = 0, .remoteOffset = 8, .length = 8};
//
// READ moves `length` bytes from remote+remoteOffset to local+localOffset; WRITE the other way.
//
// The Endpoint API document passes the same range as a tuple
// (mr_key, remote_mr_key, target_offset, source_offset, length) whose offsets are named after the
// direction of the bytes: target_offset is where they land (local for READ, remote for WRITE),
// source_offset where they come from (remote for READ, local for WRITE). fromTuple() converts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::endpoint {

// Names a registered memory region. For a local region registered under an integer key the handle
// is that key; a region registered under a name gets a handle of kNamedHandleBase or above. For a
// remote region it is the handle the peer published for it (see Endpoint::registerRemoteMemoryRegion).
using MrHandle = uint64_t;

// Integer keys are below this; handles of named regions start here.
inline constexpr MrHandle kNamedHandleBase = MrHandle{1} << 31;

enum class OpKind : uint8_t { kRead, kWrite, kWriteWithImm, kSend, kRecv, kImmRecv };
// "read", "write", "write_with_imm", "send", "recv", "imm_recv", in OpKind order (the names metrics use).
inline std::vector<std::string> opKindNames() {
  return {"read", "write", "write_with_imm", "send", "recv", "imm_recv"};
}

// One range of a READ, WRITE or WRITE_WITH_IMM batch.
struct Assignment {
  MrHandle local = 0;         // the local region
  MrHandle remote = 0;        // the remote region
  uint64_t localOffset = 0;   // bytes from the start of the local region
  uint64_t remoteOffset = 0;  // bytes from the start of the remote region
  uint64_t length = 0;        // bytes to move (0: nothing moves)

  bool operator==(const Assignment&) const = default;
};

// The document's tuple for an operation of `kind` (kRead, kWrite or kWriteWithImm) as an Assignment.
inline Assignment fromTuple(OpKind kind, MrHandle mrKey, MrHandle remoteMrKey, uint64_t targetOffset,
                            uint64_t sourceOffset, uint64_t length) {
  if (kind == OpKind::kRead) {
    return {.local = mrKey,
            .remote = remoteMrKey,
            .localOffset = targetOffset,
            .remoteOffset = sourceOffset,
            .length = length};
  }
  return {.local = mrKey,
          .remote = remoteMrKey,
          .localOffset = sourceOffset,
          .remoteOffset = targetOffset,
          .length = length};
}

// One piece of a message: `length` bytes at `offset` of local region `mr`. A send() gathers its
// chunks, in order, into one message; a recv() scatters one message over its chunks.
struct Chunk {
  MrHandle mr = 0;
  uint64_t offset = 0;
  uint64_t length = 0;

  bool operator==(const Chunk&) const = default;
};

}  // namespace ferry::endpoint
