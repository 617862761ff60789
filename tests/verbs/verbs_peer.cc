// verbs_peer: the other process of the multi-process verbs tests, driven line by line.
//
// Reads one command per line on stdin and answers each with exactly one line on stdout:
// "ok[ <values>]" or "error <message>". Logs go to stderr. Exits on "exit" or at end of input.
// Numbers are decimal; patterns are the test suite's (tests/support/verbs_fixture.h), with the
// pattern position of a byte equal to its offset in its region unless a position is given.
//
//   open <device>                               context, PD, send and receive CQ of 4096 entries
//   qp [max_send_wr] [max_recv_wr]              an RC QP -> "ok <qp> <local path as JSON>"
//   connect <qp> <timeout> <retries> <rnr_retries> <min_rnr_timer> <access> <peer path JSON>
//                                               reverse the peer's path and establish
//   mr <size> <access> <seed>                   register size bytes holding pattern(seed)
//                                               -> "ok <mr> <addr> <rkey> <length>"
//   fill <mr> <offset> <length> <seed>          write pattern(seed) there
//   check <mr> <offset> <length> <seed> [pos]   compare with pattern(seed) from position pos
//                                               (default: offset) -> "ok" or "error mismatch ..."
//   get64 <mr> <offset> / set64 <mr> <offset> <value>
//   dereg <mr>                                  close the region (its memory stays mapped)
//   recv <qp> <wr_id> <mr> <offset> <length>    post a receive
//   post <qp> <opcode> <wr_id> <mr> <offset> <length> <remote_addr> <rkey> [imm|add|compare] [swap]
//                                               opcode: write write_imm send send_imm read cas faa
//   poll <send|recv> <count> <timeout_ms>       -> "ok <wr_id>:<STATUS>:<OPCODE>:<byte_len>:<imm> ..."
//   state <qp>                                  -> "ok <STATE>"
//   reset <qp>                                  move the QP to RESET (connect sets it up again)
//   exit
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;

struct PeerState {
  v::Context context;
  v::ProtectionDomain pd;
  v::CompletionQueue sendCq;
  v::CompletionQueue recvCq;
  std::vector<RegisteredBuffer> regions;
  std::vector<v::QueuePair> qps;
  std::vector<v::Path> localPaths;
};

std::string execute(PeerState& state, const std::string& line, bool* quit) {
  std::istringstream in(line);
  std::string command;
  in >> command;
  auto fail = [](const std::string& message) { return "error " + message; };
  auto fromStatus = [&](const Status& status) {
    return status.isOk() ? std::string("ok") : fail(status.toString());
  };
  auto region = [&](size_t index) -> RegisteredBuffer* {
    return index < state.regions.size() ? &state.regions[index] : nullptr;
  };
  auto queuePair = [&](size_t index) -> v::QueuePair* {
    return index < state.qps.size() ? &state.qps[index] : nullptr;
  };

  if (command == "exit") {
    *quit = true;
    return "ok";
  }
  if (command == "open") {
    std::string device;
    if (!(in >> device)) return fail("usage: open <device>");
    Result<v::Context> context = openDevice(device);
    if (!context.isOk()) return fail(context.status().toString());
    state.context = std::move(context).value();
    Result<v::ProtectionDomain> pd = state.context.allocPd();
    if (!pd.isOk()) return fail(pd.status().toString());
    state.pd = std::move(pd).value();
    for (v::CompletionQueue* cq : {&state.sendCq, &state.recvCq}) {
      Result<v::CompletionQueue> created = state.context.createCq({.cqe = 4096});
      if (!created.isOk()) return fail(created.status().toString());
      *cq = std::move(created).value();
    }
    return "ok";
  }
  if (command == "qp") {
    uint32_t sendWr = 256, recvWr = 256;
    in >> sendWr >> recvWr;
    Result<v::QueuePair> qp = state.pd.createQp(
        {.sendCq = &state.sendCq,
         .recvCq = &state.recvCq,
         .cap = {.maxSendWr = sendWr, .maxRecvWr = recvWr, .maxSendSge = 4, .maxRecvSge = 4}});
    if (!qp.isOk()) return fail(qp.status().toString());
    Result<v::Path> path = makeLocalPath(state.context, *qp);
    if (!path.isOk()) return fail(path.status().toString());
    state.qps.push_back(std::move(qp).value());
    state.localPaths.push_back(*path);
    return "ok " + std::to_string(state.qps.size() - 1) + " " + path->toJson();
  }
  if (command == "connect") {
    size_t index = 0;
    unsigned timeout = 0, retries = 0, rnrRetries = 0, minRnrTimer = 0, access = 0;
    if (!(in >> index >> timeout >> retries >> rnrRetries >> minRnrTimer >> access)) {
      return fail("usage: connect <qp> <timeout> <retries> <rnr_retries> <min_rnr_timer> <access> <json>");
    }
    v::QueuePair* qp = queuePair(index);
    if (qp == nullptr) return fail("no such qp");
    std::string json;
    std::getline(in, json);
    Result<v::Path> peer = v::Path::fromJson(json);
    if (!peer.isOk()) return fail(peer.status().toString());
    const LinkOptions link{.timeout = static_cast<uint8_t>(timeout),
                           .retries = static_cast<uint8_t>(retries),
                           .rnrRetries = static_cast<uint8_t>(rnrRetries),
                           .minRnrTimer = static_cast<uint8_t>(minRnrTimer)};
    Result<v::Path> path = pathTowardsPeer(state.context, *qp, state.localPaths[index], *peer, link);
    if (!path.isOk()) return fail(path.status().toString());
    return fromStatus(qp->establish(*path, access));
  }
  if (command == "mr") {
    size_t size = 0;
    uint32_t access = 0;
    uint64_t seed = 0;
    if (!(in >> size >> access >> seed)) return fail("usage: mr <size> <access> <seed>");
    Result<RegisteredBuffer> buffer = registerBuffer(state.pd, size, access, seed);
    if (!buffer.isOk()) return fail(buffer.status().toString());
    state.regions.push_back(std::move(buffer).value());
    const RegisteredBuffer& added = state.regions.back();
    return "ok " + std::to_string(state.regions.size() - 1) + " " + std::to_string(added.address()) + " " +
           std::to_string(added.mr.rkey()) + " " + std::to_string(added.size());
  }
  if (command == "fill" || command == "check") {
    size_t index = 0, offset = 0, length = 0;
    uint64_t seed = 0;
    if (!(in >> index >> offset >> length >> seed))
      return fail("usage: " + command + " <mr> <offset> <length> <seed>");
    uint64_t position = offset;
    in >> position;
    RegisteredBuffer* buffer = region(index);
    if (buffer == nullptr || offset + length > buffer->size()) return fail("no such region or range");
    std::span<uint8_t> bytes(buffer->data() + offset, length);
    if (command == "fill") {
      fillPattern(bytes, seed, position);
      return "ok";
    }
    ::testing::AssertionResult matches = matchesPattern(bytes, seed, position);
    return matches ? std::string("ok") : fail(std::string("mismatch: ") + matches.message());
  }
  if (command == "get64" || command == "set64") {
    size_t index = 0, offset = 0;
    if (!(in >> index >> offset)) return fail("usage: " + command + " <mr> <offset>");
    RegisteredBuffer* buffer = region(index);
    if (buffer == nullptr || offset + 8 > buffer->size()) return fail("no such region or range");
    uint64_t value = 0;
    if (command == "get64") {
      std::memcpy(&value, buffer->data() + offset, 8);
      return "ok " + std::to_string(value);
    }
    if (!(in >> value)) return fail("usage: set64 <mr> <offset> <value>");
    std::memcpy(buffer->data() + offset, &value, 8);
    return "ok";
  }
  if (command == "dereg") {
    size_t index = 0;
    in >> index;
    RegisteredBuffer* buffer = region(index);
    if (buffer == nullptr) return fail("no such region");
    buffer->mr.close();
    return "ok";
  }
  if (command == "recv") {
    size_t index = 0, mrIndex = 0, offset = 0, length = 0;
    uint64_t wrId = 0;
    if (!(in >> index >> wrId >> mrIndex >> offset >> length)) {
      return fail("usage: recv <qp> <wr_id> <mr> <offset> <length>");
    }
    v::QueuePair* qp = queuePair(index);
    RegisteredBuffer* buffer = region(mrIndex);
    if (qp == nullptr || buffer == nullptr) return fail("no such qp or region");
    return fromStatus(postReceive(*qp, wrId, {sgeOf(*buffer, offset, length)}));
  }
  if (command == "post") {
    size_t index = 0, mrIndex = 0, offset = 0, length = 0;
    std::string opcode;
    uint64_t wrId = 0, remoteAddr = 0, extra = 0, swap = 0;
    uint32_t rkey = 0;
    if (!(in >> index >> opcode >> wrId >> mrIndex >> offset >> length >> remoteAddr >> rkey)) {
      return fail("usage: post <qp> <opcode> <wr_id> <mr> <offset> <length> <remote_addr> <rkey> [x] [swap]");
    }
    in >> extra >> swap;
    v::QueuePair* qp = queuePair(index);
    RegisteredBuffer* buffer = region(mrIndex);
    if (qp == nullptr || buffer == nullptr) return fail("no such qp or region");
    static const std::pair<const char*, v::WrOpcode> kOpcodes[] = {
        {"write", v::WrOpcode::kRdmaWrite},
        {"write_imm", v::WrOpcode::kRdmaWriteWithImm},
        {"send", v::WrOpcode::kSend},
        {"send_imm", v::WrOpcode::kSendWithImm},
        {"read", v::WrOpcode::kRdmaRead},
        {"cas", v::WrOpcode::kAtomicCmpAndSwp},
        {"faa", v::WrOpcode::kAtomicFetchAndAdd}};
    const auto* found = std::find_if(std::begin(kOpcodes), std::end(kOpcodes),
                                     [&](const auto& entry) { return opcode == entry.first; });
    if (found == std::end(kOpcodes)) return fail("unknown opcode " + opcode);
    SendOp op{.opcode = found->second,
              .wrId = wrId,
              .remoteAddr = remoteAddr,
              .rkey = rkey,
              .imm = static_cast<uint32_t>(extra),
              .compareAdd = extra,
              .swap = swap};
    if (length > 0) op.sges.push_back(sgeOf(*buffer, offset, length));
    return fromStatus(post(*qp, op));
  }
  if (command == "poll") {
    std::string which;
    size_t count = 0;
    int timeoutMs = 0;
    if (!(in >> which >> count >> timeoutMs) || (which != "send" && which != "recv")) {
      return fail("usage: poll <send|recv> <count> <timeout_ms>");
    }
    std::vector<v::WorkCompletion> completions;
    ::testing::AssertionResult polled = pollCompletions(which == "send" ? state.sendCq : state.recvCq, count,
                                                        &completions, std::chrono::milliseconds(timeoutMs));
    if (!polled) return fail(polled.message());
    std::string reply = "ok";
    for (const v::WorkCompletion& wc : completions) {
      reply += " " + std::to_string(wc.wrId) + ":" + v::wcStatusName(wc.status) + ":" +
               v::wcOpcodeName(wc.opcode) + ":" + std::to_string(wc.byteLen) + ":" +
               std::to_string(wc.immData);
    }
    return reply;
  }
  if (command == "state") {
    size_t index = 0;
    in >> index;
    v::QueuePair* qp = queuePair(index);
    if (qp == nullptr) return fail("no such qp");
    Result<v::QpAttr> attr = qp->query();
    if (!attr.isOk()) return fail(attr.status().toString());
    return std::string("ok ") + v::qpStateName(attr->state);
  }
  if (command == "reset") {
    size_t index = 0;
    in >> index;
    v::QueuePair* qp = queuePair(index);
    if (qp == nullptr) return fail("no such qp");
    v::QpAttr attr;
    attr.state = v::QpState::kReset;
    return fromStatus(qp->modify(attr, v::qp_attr_mask::kState));
  }
  return fail("unknown command '" + command + "'");
}

}  // namespace
}  // namespace ferry::test

int main() {
  ferry::test::PeerState state;
  std::string line;
  bool quit = false;
  while (!quit && std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const std::string reply = ferry::test::execute(state, line, &quit);
    std::fputs(reply.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  return 0;
}
