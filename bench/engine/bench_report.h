// Results of `ferry bench`: the perftest-style table, the JSON document and the PNG plot.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "common/json.h"

namespace ferry::cli::bench {

struct RunMeasurement;

// The figures of one message size.
struct SizeResult {
  uint64_t size = 0;
  uint64_t iterations = 0;  // timed iterations, all threads (endpoint: operations)
  double seconds = 0;       // bandwidth: first timed post to last completion
  double gbps = 0;          // 10^9 bytes per second
  double mpps = 0;          // 10^6 messages per second (endpoint: assignments or chunks)
  bool latency = false;
  double minUs = 0, medianUs = 0, p99Us = 0, avgUs = 0, maxUs = 0;
  double clientCpuSeconds = 0, clientWallSeconds = 0;
  double warmupSeconds = 0;  // from the run's start to every thread warmed up (set-up included)
  double serverCpuSeconds = 0, serverWallSeconds = 0;
  // The whole machine's busy share during the measured part, in percent of all its cores (-1:
  // unknown). With --local both processes run here, so this is what the transfer cost the machine.
  double machineBusyPercent = -1;
  // Endpoint API: the messages of the timed operations (operations x batch), the mean time inside
  // the call that issues one operation, the wall time per message, and the bytes checked after
  // the run on the side they landed on.
  uint64_t messages = 0;
  double callUs = 0;
  double usPerMessage = 0;
  uint64_t verifiedBytes = 0;
};

struct BenchReport {
  RunShape shape;
  std::string clientDevice;
  std::string serverDevice;
  std::string server;          // host:port of the control connection
  std::string iterationsRule;  // "--iters 100", "--duration 2", "auto"
  std::vector<SizeResult> results;
};

// The figures of a run of `size` from what the client measured.
SizeResult summarize(uint64_t size, const RunShape& shape, const RunMeasurement& measured);
// Nearest-rank percentile of sorted samples (p in [0, 100]); 0 for none.
double percentile(const std::vector<double>& sorted, double p);

void printHeader(FILE* out, const BenchReport& report);
void printRow(FILE* out, const RunShape& shape, const SizeResult& r);
json::Value reportJson(const BenchReport& report);

}  // namespace ferry::cli::bench
