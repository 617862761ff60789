// Results of `ferry bench` (see bench_report.h).
#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>

#include "bench_engine.h"
#include "ferry/common/config.h"

namespace ferry::cli::bench {
namespace {

double percentOf(double cpu, double wall) { return wall > 0 ? 100.0 * cpu / wall : 0; }

// One column of the table: its title, its width and how a result shows in it.
struct Column {
  const char* title;
  int width;
  std::function<std::string(const SizeResult&)> value;
};

std::string fixed(double v, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

std::vector<Column> columnsOf(const RunShape& s) {
  const bool endpoint = s.api == Api::kEndpoint;
  std::vector<Column> c;
  c.push_back({"#bytes", 10, [](const SizeResult& r) { return formatSize(r.size); }});
  c.push_back({endpoint ? "#operations" : "#iterations", 12,
               [](const SizeResult& r) { return std::to_string(r.iterations); }});
  if (s.mode == Mode::kBandwidth) {
    c.push_back({"BW average[GB/s]", 16, [](const SizeResult& r) { return fixed(r.gbps, 4); }});
    c.push_back({"MsgRate[Mpps]", 14, [](const SizeResult& r) { return fixed(r.mpps, 4); }});
  } else {
    c.push_back({"t_min[us]", 11, [](const SizeResult& r) { return fixed(r.minUs, 2); }});
    c.push_back({"t_median[us]", 14, [](const SizeResult& r) { return fixed(r.medianUs, 2); }});
    c.push_back({"t_p99[us]", 11, [](const SizeResult& r) { return fixed(r.p99Us, 2); }});
    c.push_back({"t_avg[us]", 11, [](const SizeResult& r) { return fixed(r.avgUs, 2); }});
  }
  if (endpoint) c.push_back({"t_msg[us]", 11, [](const SizeResult& r) { return fixed(r.usPerMessage, 3); }});
  if (endpoint || s.callTime) {
    c.push_back({"t_call[us]", 11, [](const SizeResult& r) { return fixed(r.callUs, 3); }});
  }
  c.push_back({"CPU client[%]", 14, [](const SizeResult& r) {
                 return fixed(percentOf(r.clientCpuSeconds, r.clientWallSeconds), 1);
               }});
  c.push_back({"CPU server[%]", 14, [](const SizeResult& r) {
                 return fixed(percentOf(r.serverCpuSeconds, r.serverWallSeconds), 1);
               }});
  return c;
}

}  // namespace

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

SizeResult summarize(uint64_t size, const RunShape& shape, const RunMeasurement& m) {
  SizeResult r;
  r.size = size;
  r.iterations = m.iterations;
  r.seconds = m.seconds;
  // An endpoint operation moves `batch` messages (assignments, or chunks of one send).
  r.messages = m.iterations * (shape.api == Api::kEndpoint ? static_cast<uint64_t>(shape.batch) : 1);
  if (m.seconds > 0) {
    r.gbps = static_cast<double>(size) * static_cast<double>(r.messages) / m.seconds / 1e9;
    r.mpps = static_cast<double>(r.messages) / m.seconds / 1e6;
  }
  if (r.messages > 0) r.usPerMessage = m.seconds * 1e6 / static_cast<double>(r.messages);
  if (m.iterations > 0) r.callUs = m.callSeconds * 1e6 / static_cast<double>(m.iterations);
  r.verifiedBytes = m.verifiedBytes;
  const std::vector<double>& sorted = m.latencyUs;
  if (shape.mode == Mode::kLatency && !sorted.empty()) {
    r.latency = true;
    r.minUs = sorted.front();
    r.maxUs = sorted.back();
    size_t n = sorted.size();
    r.medianUs = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    r.p99Us = percentile(sorted, 99);
    r.avgUs = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(n);
  }
  return r;
}

void printHeader(FILE* out, const BenchReport& rep) {
  const RunShape& s = rep.shape;
  const bool endpoint = s.api == Api::kEndpoint;
  std::fprintf(out, "ferry bench: %s%s %s, %s -> %s (server %s)\n", endpoint ? "Endpoint API " : "",
               opName(s.op), s.mode == Mode::kBandwidth ? "bandwidth" : "latency", rep.clientDevice.c_str(),
               rep.serverDevice.c_str(), rep.server.c_str());
  if (endpoint) {
    std::fprintf(out, "  1 endpoint, num_qp %d, batch %d (%s of #bytes per call)", s.qps, s.batch,
                 s.op == Op::kSend ? "chunks" : "assignments");
    if (s.mode == Mode::kBandwidth) std::fprintf(out, ", %d operations in flight", s.depth);
  } else {
    std::fprintf(out, "  %d thread%s x %d QP%s", s.threads, s.threads == 1 ? "" : "s", s.qps,
                 s.qps == 1 ? "" : "s");
    if (s.mode == Mode::kBandwidth) std::fprintf(out, ", depth %d, batch %d", s.depth, s.batch);
  }
  std::fprintf(out, ", iterations: %s\n", rep.iterationsRule.c_str());
  if (endpoint) {
    std::fprintf(
        out, "  %st_msg = wall time per assignment; t_call = time in the call that issues an operation\n",
        s.mode == Mode::kLatency ? "latency = call to wait() returned, one operation at a time; " : "");
  } else if (s.mode == Mode::kLatency) {
    std::fprintf(out, "  %s%s\n",
                 isPingPong(s) ? "ping-pong: one-way latency = round trip / 2"
                               : "latency = post to completion (one request at a time)",
                 s.callTime ? "; t_call = time inside postSend" : "");
  }
  std::fprintf(out,
               "---------------------------------------------------------------------------------------\n");
  for (const Column& c : columnsOf(s)) std::fprintf(out, " %-*s", c.width, c.title);
  std::fprintf(out, "\n");
  std::fflush(out);
}

void printRow(FILE* out, const RunShape& s, const SizeResult& r) {
  for (const Column& c : columnsOf(s)) std::fprintf(out, " %-*s", c.width, c.value(r).c_str());
  std::fprintf(out, "\n");
  std::fflush(out);
}

json::Value reportJson(const BenchReport& rep) {
  const RunShape& s = rep.shape;
  json::Value doc = json::Value::emptyObject();
  doc.set("ferry_bench", kProtocolVersion);
  doc.set("api", apiName(s.api));
  // The language of the client that measured: bench/endpoint_client.py writes "python".
  doc.set("language", "c++");
  doc.set("op", opName(s.op));
  doc.set("mode", modeName(s.mode));
  doc.set("client_device", rep.clientDevice);
  doc.set("server_device", rep.serverDevice);
  doc.set("server", rep.server);
  doc.set("memory", s.sharedMemory ? "shared" : "heap");
  doc.set("wait", s.events ? "event" : "poll");
  doc.set("poll_yield", s.pollYield);
  doc.set("threads", s.threads);
  doc.set("qps", s.qps);
  doc.set("depth", s.depth);
  doc.set("batch", s.batch);
  doc.set("iterations_rule", rep.iterationsRule);
  doc.set("latency_kind", s.mode == Mode::kBandwidth ? "none"
                          : isPingPong(s)            ? "one_way_half_rtt"
                                                     : "post_to_completion");
  json::Value sameHost;  // as set (null when unset), for the record
  json::Value tcpStripe;
  for (const config::Setting& s : config::settings()) {
    if (!s.set) continue;
    if (std::string_view(s.variable->name) == "FERRY_SOFT_SAME_HOST") sameHost = s.raw;
    if (std::string_view(s.variable->name) == "FERRY_SOFT_TCP_STRIPE") tcpStripe = s.raw;
  }
  doc.set("ferry_soft_same_host", std::move(sameHost));
  doc.set("ferry_soft_tcp_stripe", std::move(tcpStripe));
  json::Array results;
  for (const SizeResult& r : rep.results) {
    json::Value o = json::Value::emptyObject();
    o.set("size", static_cast<int64_t>(r.size));
    o.set("iterations", static_cast<int64_t>(r.iterations));
    o.set("seconds", r.seconds);
    o.set("warmup_seconds", r.warmupSeconds);
    o.set("bw_gbps", r.gbps);
    o.set("msg_rate_mpps", r.mpps);
    if (r.latency) {
      json::Value lat = json::Value::emptyObject();
      lat.set("min", r.minUs);
      lat.set("median", r.medianUs);
      lat.set("p99", r.p99Us);
      lat.set("avg", r.avgUs);
      lat.set("max", r.maxUs);
      o.set("lat_us", std::move(lat));
    }
    if (s.api == Api::kEndpoint) {
      o.set("messages", static_cast<int64_t>(r.messages));
      o.set("us_per_message", r.usPerMessage);
      o.set("call_us", r.callUs);
      o.set("verified_bytes", static_cast<int64_t>(r.verifiedBytes));
    } else if (s.callTime) {
      o.set("call_us", r.callUs);
    }
    o.set("client_cpu_seconds", r.clientCpuSeconds);
    o.set("client_cpu_percent", percentOf(r.clientCpuSeconds, r.clientWallSeconds));
    o.set("server_cpu_seconds", r.serverCpuSeconds);
    o.set("server_cpu_percent", percentOf(r.serverCpuSeconds, r.serverWallSeconds));
    if (r.machineBusyPercent >= 0) o.set("machine_busy_percent", r.machineBusyPercent);
    results.push_back(std::move(o));
  }
  doc.set("results", std::move(results));
  return doc;
}

}  // namespace ferry::cli::bench
