// Results of `ferry bench` (see bench_report.h).
#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>

#include "bench_engine.h"
#include "png.h"

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
  if (endpoint) {
    c.push_back({"t_msg[us]", 11, [](const SizeResult& r) { return fixed(r.usPerMessage, 3); }});
    c.push_back({"t_call[us]", 11, [](const SizeResult& r) { return fixed(r.callUs, 3); }});
  }
  c.push_back({"CPU client[%]", 14,
               [](const SizeResult& r) { return fixed(percentOf(r.clientCpuSeconds, r.clientWallSeconds), 1); }});
  c.push_back({"CPU server[%]", 14,
               [](const SizeResult& r) { return fixed(percentOf(r.serverCpuSeconds, r.serverWallSeconds), 1); }});
  return c;
}

// Axis numbers without exponents: "0.25", "1.5", "100", "10000".
std::string tickLabel(double v) {
  char text[64];
  if (v >= 1000 || v == std::floor(v)) {
    std::snprintf(text, sizeof text, "%.0f", v);
  } else {
    std::snprintf(text, sizeof text, "%.3g", v);
  }
  return text;
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
  std::fprintf(out, "ferry bench: %s%s %s, %s -> %s (server %s)\n", endpoint ? "Endpoint API " : "", opName(s.op),
               s.mode == Mode::kBandwidth ? "bandwidth" : "latency", rep.clientDevice.c_str(), rep.serverDevice.c_str(),
               rep.server.c_str());
  if (endpoint) {
    std::fprintf(out, "  1 endpoint, num_qp %d, batch %d (%s of #bytes per call)", s.qps, s.batch,
                 s.op == Op::kSend ? "chunks" : "assignments");
    if (s.mode == Mode::kBandwidth) std::fprintf(out, ", %d operations in flight", s.depth);
  } else {
    std::fprintf(out, "  %d thread%s x %d QP%s", s.threads, s.threads == 1 ? "" : "s", s.qps, s.qps == 1 ? "" : "s");
    if (s.mode == Mode::kBandwidth) std::fprintf(out, ", depth %d, batch %d", s.depth, s.batch);
  }
  std::fprintf(out, ", iterations: %s\n", rep.iterationsRule.c_str());
  if (endpoint) {
    std::fprintf(out, "  %st_msg = wall time per assignment; t_call = time in the call that issues an operation\n",
                 s.mode == Mode::kLatency ? "latency = call to wait() returned, one operation at a time; " : "");
  } else if (s.mode == Mode::kLatency) {
    std::fprintf(out, "  %s\n", isPingPong(s) ? "ping-pong: one-way latency = round trip / 2"
                                              : "latency = post to completion (one request at a time)");
  }
  std::fprintf(out, "---------------------------------------------------------------------------------------\n");
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
  doc.set("threads", s.threads);
  doc.set("qps", s.qps);
  doc.set("depth", s.depth);
  doc.set("batch", s.batch);
  doc.set("iterations_rule", rep.iterationsRule);
  doc.set("latency_kind", s.mode == Mode::kBandwidth ? "none" : isPingPong(s) ? "one_way_half_rtt" : "post_to_completion");
  const char* sameHost = std::getenv("FERRY_SOFT_SAME_HOST");
  doc.set("ferry_soft_same_host", sameHost ? json::Value(sameHost) : json::Value());
  json::Array results;
  for (const SizeResult& r : rep.results) {
    json::Value o = json::Value::emptyObject();
    o.set("size", static_cast<int64_t>(r.size));
    o.set("iterations", static_cast<int64_t>(r.iterations));
    o.set("seconds", r.seconds);
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
    }
    o.set("client_cpu_seconds", r.clientCpuSeconds);
    o.set("client_cpu_percent", percentOf(r.clientCpuSeconds, r.clientWallSeconds));
    o.set("server_cpu_seconds", r.serverCpuSeconds);
    o.set("server_cpu_percent", percentOf(r.serverCpuSeconds, r.serverWallSeconds));
    results.push_back(std::move(o));
  }
  doc.set("results", std::move(results));
  return doc;
}

namespace {

enum : uint8_t { kWhite, kBlack, kGrid, kAxisText, kBlue, kRed, kGreen, kOrange };
const std::vector<Rgb> kPalette = {{255, 255, 255}, {0, 0, 0},    {225, 225, 225}, {90, 90, 90},
                                   {31, 119, 180},  {214, 39, 40}, {44, 160, 44},   {255, 127, 14}};

// A "nice" axis step (1, 2 or 5 times a power of ten) giving about `ticks` intervals up to top.
double niceStep(double top, int ticks) {
  double raw = top / ticks;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

struct Series {
  std::string name;
  uint8_t color;
  std::vector<double> values;  // one per result
};

}  // namespace

Status writePlot(const std::string& path, const BenchReport& rep) {
  if (rep.results.empty()) return invalidArgument("nothing to plot");
  const bool bw = rep.shape.mode == Mode::kBandwidth;
  std::vector<Series> series;
  if (bw) {
    series.push_back({"GB/s", kBlue, {}});
    for (const SizeResult& r : rep.results) series[0].values.push_back(r.gbps);
  } else {
    series.push_back({"p99", kRed, {}});
    series.push_back({"median", kBlue, {}});
    series.push_back({"min", kGreen, {}});
    for (const SizeResult& r : rep.results) {
      series[0].values.push_back(r.p99Us);
      series[1].values.push_back(r.medianUs);
      series[2].values.push_back(r.minUs);
    }
  }
  double top = 0, bottomValue = std::numeric_limits<double>::max();
  for (const Series& s : series) {
    for (double v : s.values) {
      top = std::max(top, v);
      if (v > 0) bottomValue = std::min(bottomValue, v);
    }
  }
  if (!(top > 0)) top = 1;
  if (bottomValue > top) bottomValue = top;

  const int width = 960, height = 600;
  const int left = 110, right = 40, topMargin = 90, bottom = 80;
  const int plotW = width - left - right, plotH = height - topMargin - bottom;
  Canvas c(width, height, kWhite);

  std::string title = std::string("ferry bench: ") + (rep.shape.api == Api::kEndpoint ? "endpoint " : "") +
                      opName(rep.shape.op) + (bw ? " bandwidth" : " latency") + ", " + rep.clientDevice + " -> " +
                      rep.serverDevice;
  c.text((width - Canvas::textWidth(title, 2)) / 2, 16, title, kBlack, 2);
  std::string subtitle = std::to_string(rep.shape.threads) + " thread(s) x " + std::to_string(rep.shape.qps) + " qp(s)" +
                         (bw ? ", depth " + std::to_string(rep.shape.depth) + ", batch " + std::to_string(rep.shape.batch)
                             : std::string(", ") + (isPingPong(rep.shape) ? "one-way (rtt/2)" : "post to completion"));
  c.text((width - Canvas::textWidth(subtitle, 2)) / 2, 40, subtitle, kAxisText, 2);

  // Y axis: linear from 0 for bandwidth; decades (log scale) for latency, which spans microseconds
  // to tens of milliseconds across a sweep.
  std::function<int(double)> yOf;
  if (bw) {
    double step = niceStep(top * 1.05, 6);
    double yMax = std::ceil(top * 1.05 / step) * step;
    yOf = [=](double v) { return topMargin + plotH - static_cast<int>(std::lround(v / yMax * plotH)); };
    for (double y = 0; y <= yMax + step / 2; y += step) {
      int py = yOf(y);
      c.line(left, py, left + plotW, py, kGrid);
      std::string label = tickLabel(y);
      c.text(left - 10 - Canvas::textWidth(label, 2), py - Canvas::textHeight(2) / 2, label, kAxisText, 2);
    }
  } else {
    double lo = std::floor(std::log10(bottomValue)), hi = std::ceil(std::log10(top));
    if (hi <= lo) hi = lo + 1;
    yOf = [=](double v) {
      double l = v > 0 ? std::log10(v) : lo;
      return topMargin + plotH - static_cast<int>(std::lround((l - lo) / (hi - lo) * plotH));
    };
    for (double e = lo; e <= hi; e += 1) {
      int py = yOf(std::pow(10.0, e));
      c.line(left, py, left + plotW, py, kGrid);
      std::string label = tickLabel(std::pow(10.0, e));
      c.text(left - 10 - Canvas::textWidth(label, 2), py - Canvas::textHeight(2) / 2, label, kAxisText, 2);
    }
  }
  c.text(12, topMargin - 24, bw ? "GB/s" : "latency (us, log scale)", kBlack, 2);

  // X positions: log2 of the size, spread across the plot.
  double lo = std::log2(static_cast<double>(rep.results.front().size));
  double hi = std::log2(static_cast<double>(rep.results.back().size));
  auto xOf = [&](uint64_t size) {
    if (hi <= lo) return left + plotW / 2;
    return left + 20 + static_cast<int>(std::lround((std::log2(static_cast<double>(size)) - lo) / (hi - lo) * (plotW - 40)));
  };
  for (const SizeResult& r : rep.results) {
    int px = xOf(r.size);
    c.line(px, topMargin, px, topMargin + plotH, kGrid);
    std::string label = formatSize(r.size);
    c.text(px - Canvas::textWidth(label, 2) / 2, topMargin + plotH + 10, label, kAxisText, 2);
  }
  std::string xLabel = "message size (bytes)";
  c.text(left + (plotW - Canvas::textWidth(xLabel, 2)) / 2, height - 34, xLabel, kBlack, 2);
  // Axes.
  c.line(left, topMargin, left, topMargin + plotH, kBlack, 2);
  c.line(left, topMargin + plotH, left + plotW, topMargin + plotH, kBlack, 2);

  // Series: lines and square markers.
  for (const Series& s : series) {
    for (size_t i = 0; i < s.values.size(); ++i) {
      int px = xOf(rep.results[i].size), py = yOf(s.values[i]);
      if (i > 0) c.line(xOf(rep.results[i - 1].size), yOf(s.values[i - 1]), px, py, s.color, 3);
      c.fillRect(px - 4, py - 4, 9, 9, s.color);
    }
  }
  // Legend, top left inside the plot.
  int ly = topMargin + 12;
  for (const Series& s : series) {
    c.fillRect(left + 16, ly + 3, 24, 6, s.color);
    c.text(left + 48, ly, s.name, kBlack, 2);
    ly += 22;
  }
  return writePng(path, c, kPalette);
}

}  // namespace ferry::cli::bench
