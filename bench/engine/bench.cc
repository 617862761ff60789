// `ferry bench`: server, client and --local (both, as two processes) on top of bench_engine.
//
// The control conversation, one JSON line per message, each {"ferry_bench": 1, "type": T, ...}:
//
//   client                                   server
//   hello {op, mode, threads, qps, depth,
//          batch, max_size, device, paths,
//          buffers}                    ->    checks it, builds its side, connects its QPs
//                                      <-    hello {device, paths, buffers}
//   (connects its QPs; then for each size:)
//   run {size}                         ->    posts receives, starts its responders
//                                      <-    ready
//   (warms up)  start                  ->    (CPU clock starts)
//   (measures)  progress {done} ...    ->    (every half second: the client is alive)
//   done {iterations}                  ->    stops its responders
//                                      <-    result {cpu_seconds, wall_seconds}
//   bye                                ->
//                                      <-    bye
//
// Either side may send error {message} instead and stop. Each wait has the --timeout deadline, so a
// silent or dead peer ends the run with an error rather than a hang.
#include "bench.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench_engine.h"
#include "bench_report.h"
#include "common/control_channel.h"
#include "ferry/devices.h"
#include "progress.h"

extern char** environ;

namespace ferry::cli {
namespace bench {
namespace {

int benchFailed(const char* who, const Status& st) {
  std::fprintf(stderr, "ferry bench%s: %s\n", who, st.toString().c_str());
  return 1;
}

// The device named by the user, else the one whose address is `localAddress` (the address the
// control connection uses on this host), else the first device listed.
Result<std::string> chooseDevice(const std::string& wanted, const std::string& localAddress) {
  if (!wanted.empty()) return wanted;
  FERRY_ASSIGN_OR_RETURN(auto devices, listDevices());
  if (devices.empty()) return notFound("no ferry devices here (see `ferry info`)");
  for (const auto& d : devices) {
    if (!d.address.empty() && d.address == localAddress) return d.name;
  }
  return devices.front().name;
}

// ---- server ----

Result<RunShape> decodeShape(const json::Value& hello) {
  json::Fields f = controlFields(hello);
  RunShape s;
  FERRY_ASSIGN_OR_RETURN(std::string op, f.text("op", 32));
  if (!parseOp(op, &s.op))
    return Status(StatusCode::kProtocolError, "control message 'hello': unknown op '" + op + "'");
  FERRY_ASSIGN_OR_RETURN(std::string mode, f.text("mode", 32));
  if (!parseMode(mode, &s.mode)) {
    return Status(StatusCode::kProtocolError, "control message 'hello': unknown mode '" + mode + "'");
  }
  // Clients before the Endpoint API's mode send no "api": theirs are verbs runs.
  if (f.has("api")) {
    FERRY_ASSIGN_OR_RETURN(std::string api, f.text("api", 32));
    if (!parseApi(api, &s.api)) {
      return Status(StatusCode::kProtocolError, "control message 'hello': unknown api '" + api + "'");
    }
  }
  if (f.has("memory")) {
    FERRY_ASSIGN_OR_RETURN(std::string memory, f.text("memory", 32));
    if (memory != "heap" && memory != "shared") {
      return Status(StatusCode::kProtocolError, "control message 'hello': unknown memory '" + memory + "'");
    }
    s.sharedMemory = memory == "shared";
  }
  // Clients before --wait send no "wait": theirs poll.
  if (f.has("wait")) {
    FERRY_ASSIGN_OR_RETURN(std::string wait, f.text("wait", 32));
    if (wait != "poll" && wait != "event") {
      return Status(StatusCode::kProtocolError, "control message 'hello': unknown wait '" + wait + "'");
    }
    s.events = wait == "event";
  }
  // Clients before --poll-yield send no "poll_yield": theirs yield after every empty poll.
  FERRY_ASSIGN_OR_RETURN(int64_t pollYield, f.integerOr("poll_yield", 0, kMaxPollYield, 1));
  s.pollYield = static_cast<int>(pollYield);
  FERRY_ASSIGN_OR_RETURN(int64_t threads, f.integer("threads", 1, kMaxThreads));
  FERRY_ASSIGN_OR_RETURN(int64_t qps, f.integer("qps", 1, kMaxQpsPerThread));
  FERRY_ASSIGN_OR_RETURN(int64_t depth, f.integer("depth", 1, kMaxDepth));
  FERRY_ASSIGN_OR_RETURN(int64_t batch, f.integer("batch", 1, kMaxEndpointBatch));
  FERRY_ASSIGN_OR_RETURN(int64_t maxSize, f.integer("max_size", 1, static_cast<int64_t>(kMaxMessageSize)));
  s.threads = static_cast<int>(threads);
  s.qps = static_cast<int>(qps);
  s.depth = static_cast<int>(depth);
  s.batch = static_cast<int>(batch);
  s.maxSize = static_cast<uint64_t>(maxSize);
  Status st = validateShape(s);
  if (!st.isOk()) return Status(StatusCode::kProtocolError, "control message 'hello': " + st.message());
  return s;
}

// Serves one client's runs until it says bye. Returns the exit code.
int serveClient(ControlChannel& ch, const Options& o) {
  const double t = o.timeout;
  auto hello = ch.expect("hello", t);
  if (!hello.isOk()) return ch.sendError(hello.status().message()), benchFailed(" server", hello.status());
  auto shape = decodeShape(*hello);
  if (!shape.isOk()) return ch.sendError(shape.status().message()), benchFailed(" server", shape.status());
  auto clientDevice = controlFields(*hello).text("device", 256);
  if (!clientDevice.isOk())
    return ch.sendError(clientDevice.status().message()), benchFailed(" server", clientDevice.status());

  auto device = chooseDevice(o.device, ch.localAddress());
  if (!device.isOk())
    return ch.sendError(device.status().toString()), benchFailed(" server", device.status());
  auto side = BenchSide::create(*device, *shape);
  if (!side.isOk()) {
    Status st(side.status().code(), "server device " + *device + ": " + side.status().message(),
              side.status().cause());
    return ch.sendError(st.toString()), benchFailed(" server", st);
  }
  BenchSide& s = **side;
  auto reply = s.serverHello(*hello);
  if (!reply.isOk()) return ch.sendError(reply.status().toString()), benchFailed(" server", reply.status());
  if (!o.announce) {
    std::printf("ferry bench: client %s: %s %s %s on %s, %d thread(s) x %d QP(s)\n", ch.peerAddress().c_str(),
                apiName(shape->api), opName(shape->op), modeName(shape->mode), device->c_str(),
                shape->threads, shape->qps);
    std::fflush(stdout);
  }
  reply->set("device", *device);
  Status st = ch.send("hello", *reply, t);
  if (!st.isOk()) return benchFailed(" server", st);

  while (true) {
    auto msg = ch.receive(t);
    if (!msg.isOk()) return benchFailed(" server", msg.status());
    auto type = controlFields(*msg).text("type", 4096);
    if (*type == "bye") {
      (void)ch.send("bye", json::Value::emptyObject(), t);
      return 0;
    }
    if (*type != "run") {
      Status bad(StatusCode::kProtocolError,
                 "unexpected control message '" + *type + "' (expected 'run' or 'bye')");
      return ch.sendError(bad.message()), benchFailed(" server", bad);
    }
    auto size = controlFields(*msg).integer("size", 1, static_cast<int64_t>(shape->maxSize));
    if (!size.isOk()) return ch.sendError(size.status().message()), benchFailed(" server", size.status());
    st = s.startResponders(static_cast<uint64_t>(*size), t);
    if (!st.isOk()) return ch.sendError(st.toString()), benchFailed(" server", st);
    json::Value result = json::Value::emptyObject();
    auto abandon = [&] { (void)s.finishRun(json::Value::emptyObject(), 0, result); };
    st = ch.send("ready", json::Value::emptyObject(), t);
    if (!st.isOk()) return abandon(), benchFailed(" server", st);
    double cpu0 = processCpuSeconds();
    auto wall0 = Clock::now();
    json::Value done;
    while (true) {
      auto m = ch.receive(t);
      if (!m.isOk()) return abandon(), benchFailed(" server", m.status());
      auto mt = controlFields(*m).text("type", 4096);
      if (*mt == "start") {
        cpu0 = processCpuSeconds();
        wall0 = Clock::now();
      } else if (*mt == "progress") {
        continue;
      } else if (*mt == "done") {
        done = std::move(*m);
        break;
      } else {
        Status bad(StatusCode::kProtocolError, "unexpected control message '" + *mt + "' during a run");
        abandon();
        return ch.sendError(bad.message()), benchFailed(" server", bad);
      }
    }
    // The run's figures end with the client's last operation, not with this side's checks.
    double cpu = processCpuSeconds() - cpu0;
    double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    st = s.finishRun(done, t, result);
    if (!st.isOk()) {
      Status why(st.code(), "size " + formatSize(static_cast<uint64_t>(*size)) + ": " + st.message(),
                 st.cause());
      return ch.sendError(why.toString()), benchFailed(" server", why);
    }
    result.set("cpu_seconds", cpu);
    result.set("wall_seconds", wall);
    st = ch.send("result", result, t);
    if (!st.isOk()) return benchFailed(" server", st);
  }
}

int runServer(const Options& o) {
  auto listener = ControlListener::listen(o.bind, o.port, controlProtocol());
  if (!listener.isOk()) return benchFailed(" server", listener.status());
  if (o.announce) {
    std::printf("{\"ferry_bench\":%d,\"type\":\"listening\",\"port\":%u}\n", kProtocolVersion,
                static_cast<unsigned>(listener->port()));
  } else {
    std::printf("ferry bench: server listening on %s:%u, waiting for a client\n", o.bind.c_str(),
                static_cast<unsigned>(listener->port()));
  }
  std::fflush(stdout);
  // The --local parent connects at once; a standalone server waits as long as it takes.
  auto ch = listener->accept(o.announce ? o.timeout : -1);
  if (!ch.isOk()) return benchFailed(" server", ch.status());
  int code = serveClient(*ch, o);
  if (code == 0 && !o.announce) std::printf("ferry bench: client done\n");
  return code;
}

// ---- client ----

// One size: tells the server, measures, collects the server's CPU time.
Status runOneSize(ControlChannel& ch, BenchSide& side, const Options& o, uint64_t size, ProgressBar& bar,
                  SizeResult* out) {
  const RunShape& shape = side.shape();
  RunSpec spec;
  spec.size = size;
  spec.duration = o.duration;
  spec.iters = o.duration > 0 ? 0 : (o.iters ? o.iters : autoIterations(shape.mode, size));
  spec.warmup = o.duration > 0
                    ? (shape.mode == Mode::kBandwidth ? 64 : 16)
                    : std::clamp<uint64_t>(spec.iters / 10, 1, shape.mode == Mode::kBandwidth ? 256 : 64);
  spec.stallTimeout = o.timeout;

  json::Value run = json::Value::emptyObject();
  run.set("size", static_cast<int64_t>(size));
  FERRY_RETURN_IF_ERROR(ch.send("run", run, o.timeout));
  FERRY_RETURN_IF_ERROR(ch.expect("ready", o.timeout).status());

  RunControl control;
  for (int i = 0; i < shape.threads; ++i) control.done.push_back(std::make_unique<std::atomic<uint64_t>>(0));
  RunMeasurement m;
  Status measured;
  std::atomic<bool> finished{false};
  double cpu0 = processCpuSeconds(), cpu1 = 0;
  MachineCpu machine0 = machineCpu(), machine1;
  const auto warm0 = Clock::now();  // the threads set up and warm up from here until wall0
  auto wall0 = warm0, wall1 = wall0;
  std::thread worker([&] {
    measured = side.measure(spec, control, &m);
    // The measured window ends here, not when the watching loop below notices.
    cpu1 = processCpuSeconds();
    machine1 = machineCpu();
    wall1 = Clock::now();
    finished.store(true);
  });
  auto lastBeat = Clock::now();
  bool started = false;
  Status watch;
  const std::string label = formatSize(size) + " " + opName(shape.op) + " " + modeName(shape.mode);
  const double total = static_cast<double>(spec.iters) * shape.threads;
  while (!finished.load()) {
    if (!started && control.warmedUp.load() == shape.threads) {
      cpu0 = processCpuSeconds();
      machine0 = machineCpu();
      wall0 = Clock::now();
      watch = ch.send("start", json::Value::emptyObject(), o.timeout);
      control.go.store(true);
      started = true;
    }
    // Anything from the server during a run is bad news (an error or a closed connection).
    if (watch.isOk() && ch.readable(started ? 10 : 1)) {
      auto msg = ch.receive(o.timeout);
      watch = msg.isOk() ? Status(StatusCode::kProtocolError, "unexpected control message during a run")
                         : msg.status();
    }
    if (!watch.isOk()) {
      control.abort.store(true);
      break;
    }
    if (started) {
      uint64_t done = 0;
      for (auto& d : control.done) done += d->load(std::memory_order_relaxed);
      double elapsed = std::chrono::duration<double>(Clock::now() - wall0).count();
      bar.show(label, o.duration > 0 ? elapsed / o.duration : static_cast<double>(done) / total);
      if (Clock::now() - lastBeat > std::chrono::milliseconds(500)) {
        json::Value beat = json::Value::emptyObject();
        beat.set("done", static_cast<int64_t>(done));
        watch = ch.send("progress", beat, o.timeout);
        lastBeat = Clock::now();
      }
    }
  }
  worker.join();
  double cpu = cpu1 - cpu0;
  double wall = std::chrono::duration<double>(wall1 - wall0).count();
  bar.clear();
  if (!watch.isOk()) return watch;
  if (!measured.isOk()) return measured;

  json::Value done = json::Value::emptyObject();
  done.set("iterations", static_cast<int64_t>(m.iterations));
  done.set("operations", static_cast<int64_t>(m.operations));
  FERRY_RETURN_IF_ERROR(ch.send("done", done, o.timeout));
  FERRY_ASSIGN_OR_RETURN(json::Value result, ch.expect("result", o.timeout));
  FERRY_ASSIGN_OR_RETURN(double serverCpu, controlFields(result).number("cpu_seconds", 0, 1e9));
  FERRY_ASSIGN_OR_RETURN(double serverWall, controlFields(result).number("wall_seconds", 0, 1e9));
  *out = summarize(size, shape, m);
  if (shape.api == Api::kEndpoint) {
    // Each side checks the bytes that landed on it: the server what was written or sent to it.
    FERRY_ASSIGN_OR_RETURN(
        int64_t serverVerified,
        controlFields(result).integer("verified_bytes", 0, static_cast<int64_t>(bufferBytes(shape))));
    out->verifiedBytes = std::max(m.verifiedBytes, static_cast<uint64_t>(serverVerified));
  }
  out->clientCpuSeconds = cpu;
  out->clientWallSeconds = wall;
  out->machineBusyPercent = machineBusyPercent(machine0, machine1);
  out->warmupSeconds = started ? std::chrono::duration<double>(wall0 - warm0).count() : 0;
  out->serverCpuSeconds = serverCpu;
  out->serverWallSeconds = serverWall;
  return Status::ok();
}

Status runClientSession(ControlChannel& ch, const Options& o, const std::string& serverName,
                        BenchReport* report) {
  FERRY_ASSIGN_OR_RETURN(std::string device, chooseDevice(o.device, ch.localAddress()));
  auto created = BenchSide::create(device, o.shape);
  if (!created.isOk()) {
    Status st(created.status().code(), "device " + device + ": " + created.status().message(),
              created.status().cause());
    ch.sendError("the client could not set up: " + st.toString());
    return st;
  }
  BenchSide& side = **created;
  auto hello = side.clientHello();
  if (!hello.isOk()) return ch.sendError(hello.status().toString()), hello.status();
  hello->set("op", opName(o.shape.op));
  hello->set("mode", modeName(o.shape.mode));
  hello->set("api", apiName(o.shape.api));
  hello->set("memory", o.shape.sharedMemory ? "shared" : "heap");
  hello->set("wait", o.shape.events ? "event" : "poll");
  hello->set("poll_yield", o.shape.pollYield);
  hello->set("threads", o.shape.threads);
  hello->set("qps", o.shape.qps);
  hello->set("depth", o.shape.depth);
  hello->set("batch", o.shape.batch);
  hello->set("max_size", static_cast<int64_t>(o.shape.maxSize));
  hello->set("device", device);
  FERRY_RETURN_IF_ERROR(ch.send("hello", *hello, o.timeout));
  FERRY_ASSIGN_OR_RETURN(json::Value reply, ch.expect("hello", o.timeout));
  auto check = [&](Status st) {
    if (!st.isOk()) ch.sendError(st.message());
    return st;
  };
  auto serverDevice = controlFields(reply).text("device", 256);
  FERRY_RETURN_IF_ERROR(check(serverDevice.status()));
  FERRY_RETURN_IF_ERROR(check(side.finishHello(reply)));

  report->shape = o.shape;
  report->clientDevice = device;
  report->serverDevice = *serverDevice;
  report->server = serverName;
  char durationText[32];
  std::snprintf(durationText, sizeof durationText, "%g", o.duration);
  report->iterationsRule = o.duration > 0 ? std::string("--duration ") + durationText
                           : o.iters      ? "--iters " + std::to_string(o.iters)
                                          : "auto (per size)";
  FILE* table = o.json ? stderr : stdout;
  printHeader(table, *report);
  ProgressBar bar(isatty(STDERR_FILENO) == 1);
  for (uint64_t size : o.sizes) {
    SizeResult r;
    Status st = runOneSize(ch, side, o, size, bar, &r);
    if (!st.isOk()) {
      ch.sendError(st.toString());
      return Status(st.code(), "size " + formatSize(size) + ": " + st.message(), st.cause());
    }
    report->results.push_back(r);
    printRow(table, o.shape, r);
  }
  FERRY_RETURN_IF_ERROR(ch.send("bye", json::Value::emptyObject(), o.timeout));
  FERRY_RETURN_IF_ERROR(ch.expect("bye", o.timeout).status());
  return Status::ok();
}

int finishReport(const Options& o, const BenchReport& report) {
  if (o.json) {
    std::printf("%s\n", json::serialize(reportJson(report)).c_str());
    std::fflush(stdout);
  }
  return 0;
}

int runClient(const Options& o) {
  auto ch = ControlChannel::connect(o.host, o.port, o.timeout, controlProtocol());
  if (!ch.isOk()) return benchFailed("", ch.status());
  BenchReport report;
  Status st = runClientSession(*ch, o, o.host + ":" + std::to_string(o.port), &report);
  if (!st.isOk()) return benchFailed("", st);
  return finishReport(o, report);
}

// Waits up to `seconds` for the child to exit; then ends it. Returns its exit code (or 1).
int reap(pid_t pid, double seconds) {
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return 1;
    if (Clock::now() > deadline) {
      kill(pid, SIGTERM);
      waitpid(pid, &status, 0);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int runLocal(const Options& o, const std::string& self) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return benchFailed("", ioError("pipe"));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::string timeoutText = std::to_string(o.timeout);
  std::vector<std::string> words = {self,        "bench",  "--server", "--announce", "--bind",
                                    "127.0.0.1", "--port", "0",        "--timeout",  timeoutText};
  const std::string& serverDevice = o.serverDevice.empty() ? o.device : o.serverDevice;
  if (!serverDevice.empty()) {
    words.push_back("--device");
    words.push_back(serverDevice);
  }
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return benchFailed("", ioError("cannot start the server process " + self, rc));
  }
  // The server's first line names its port.
  ControlChannel announce(out[0], controlProtocol());
  auto line = announce.expect("listening", o.timeout);
  if (!line.isOk()) {
    kill(pid, SIGTERM);
    reap(pid, 5);
    return benchFailed(
        "", Status(line.status().code(), "the server process did not start: " + line.status().message()));
  }
  auto port = controlFields(*line).integer("port", 1, 65535);
  if (!port.isOk()) {
    kill(pid, SIGTERM);
    reap(pid, 5);
    return benchFailed("", port.status());
  }
  auto ch = ControlChannel::connect("127.0.0.1", static_cast<uint16_t>(*port), o.timeout, controlProtocol());
  if (!ch.isOk()) {
    kill(pid, SIGTERM);
    reap(pid, 5);
    return benchFailed("", ch.status());
  }
  BenchReport report;
  Status st = runClientSession(
      *ch, o, "127.0.0.1:" + std::to_string(*port) + " (pid " + std::to_string(pid) + ")", &report);
  ch->close();
  int serverCode = reap(pid, o.timeout);
  if (!st.isOk()) return benchFailed("", st);
  if (serverCode != 0) {
    return benchFailed(
        "", Status(StatusCode::kUnavailable, "the server process exited with " + std::to_string(serverCode)));
  }
  return finishReport(o, report);
}

}  // namespace
}  // namespace bench

int runBench(const std::vector<std::string>& args, const std::string& self) {
  auto options = bench::parseOptions(args);
  if (!options.isOk()) {
    if (options.status().code() == StatusCode::kCancelled) {
      bench::printUsage(stdout);
      return 0;
    }
    std::fprintf(stderr, "ferry bench: %s (ferry bench --help lists every option)\n",
                 options.status().message().c_str());
    return 2;
  }
  // Before any device opens (and inherited by --local's server process).
  if (!options->softSameHost.empty()) setenv("FERRY_SOFT_SAME_HOST", options->softSameHost.c_str(), 1);
  // A peer that vanishes must not kill this process through SIGPIPE on the control connection.
  signal(SIGPIPE, SIG_IGN);
  switch (options->role) {
    case bench::Options::Role::kServer: return bench::runServer(*options);
    case bench::Options::Role::kLocal: return bench::runLocal(*options, self);
    case bench::Options::Role::kClient: return bench::runClient(*options);
  }
  return 2;
}

}  // namespace ferry::cli
