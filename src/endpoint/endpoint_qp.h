// EndpointQp: one queue pair of an endpoint and its bookkeeping (internal to the endpoint layer).
//
// Every field is touched under the endpoint's lock. Send work requests are built into `batch` (their
// SGEs into `sges`, whose capacity is reserved for a full queue so pointers into it stay valid) and
// posted together; `inflight` holds one record per outstanding send work request, in post order, so
// a completion finds its operation without a table keyed by counters.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "endpoint/op_state.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

struct EndpointQp {
  struct Record {
    uint64_t seq = 0;
    std::shared_ptr<OpState> op;  // nullptr for a liveness probe
  };

  size_t index = 0;
  verbs::QueuePair queuePair;
  uint32_t qpNum = 0;
  verbs::Path local;         // what endpointInfo() publishes for it
  uint32_t outstanding = 0;  // send work requests posted (or being built), not completed
  uint64_t nextSeq = 1;
  std::deque<Record> inflight;  // one per outstanding send work request, in post order
  uint32_t sinceSignal = 0;
  std::vector<verbs::SendWr> batch;  // built, not posted yet
  std::vector<verbs::Sge> sges;      // their SGEs (capacity reserved: never reallocates)
  uint32_t receivesPosted = 0;
  uint64_t nextMessage = 0;         // number of the next message arriving on this queue pair
  std::deque<uint32_t> immediates;  // immediates that arrived here, not matched yet
  uint64_t workRequests = 0;
  uint64_t bytes = 0;
  uint32_t maxOutstanding = 0;

  // Adds a work request to the batch with its SGEs copied into `sges`.
  void append(verbs::SendWr wr, std::span<const verbs::Sge> list) {
    size_t start = sges.size();
    // The capacity was reserved for a full queue of work requests with the most SGEs each.
    sges.insert(sges.end(), list.begin(), list.end());
    wr.sgList = std::span<const verbs::Sge>(sges.data() + start, list.size());
    batch.push_back(wr);
  }
};

}  // namespace ferry::endpoint
