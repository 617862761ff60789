#include "ferry/endpoint/worker.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "endpoint/endpoint_internal.h"
#include "ferry/endpoint/context.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::endpoint {

// Everything the thread touches lives here, held by the thread as well as by the Worker, so the
// Worker may end (even on its own thread) without pulling memory from under the loop.
struct Worker::State {
  WorkerOptions options;
  int epfd = -1;
  int wakefd = -1;

  mutable std::mutex mu;
  struct Entry {
    std::weak_ptr<EndpointImpl> endpoint;
    const EndpointImpl* raw = nullptr;  // alive while the entry is: an endpoint detaches before it ends
  };
  std::unordered_map<uint64_t, Entry> entries;  // epoll key -> endpoint
  std::unordered_map<const EndpointImpl*, uint64_t> keys;
  uint64_t nextKey = 1;  // 0 is the wake-up eventfd
  bool started = false;
  bool stopped = false;
  std::thread thread;
  std::atomic<bool> stopping{false};

  ~State() {
    if (epfd >= 0) ::close(epfd);
    if (wakefd >= 0) ::close(wakefd);
  }

  void wake() const {
    uint64_t one = 1;
    ssize_t n = ::write(wakefd, &one, sizeof one);
    (void)n;
  }

  void run();
  // How long run() may sleep (-1: until woken): until the next probe while an endpoint has a
  // receive waiting (else the probe period starts again), or until a CQ left unarmed is due.
  int sleepMs(std::chrono::steady_clock::time_point& nextProbe,
              std::chrono::steady_clock::duration probeEvery);
  // Adds to `ready` the endpoints to progress: those whose completion channel is among the
  // `n` events, and those whose CQ was left unarmed and is due.
  void collectReady(const epoll_event* events, int n, std::vector<std::shared_ptr<EndpointImpl>>& ready);
};

namespace {

// The CPUs of a NUMA node from sysfs ("0-3,8-11"); empty when unknown.
std::vector<int> nodeCpus(int node) {
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string text;
  if (!in || !std::getline(in, text)) return {};
  std::vector<int> cpus;
  std::stringstream ranges(text);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    int lo = 0, hi = 0;
    size_t dash = range.find('-');
    try {
      lo = std::stoi(range.substr(0, dash));
      hi = dash == std::string::npos ? lo : std::stoi(range.substr(dash + 1));
    } catch (...) {
      return {};
    }
    for (int c = lo; c <= hi && c < CPU_SETSIZE; ++c) cpus.push_back(c);
  }
  return cpus;
}

void pinToNode(int node) {
  std::vector<int> cpus = nodeCpus(node);
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    FERRY_LOG(kInfo, "endpoint worker: cannot pin to NUMA node %d; running unpinned", node);
  }
}

}  // namespace

void Worker::State::run() {
  if (options.socketId >= 0) pinToNode(options.socketId);
  std::string name = "ferry-ep-w" + std::to_string(options.id);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());

  using Clock = std::chrono::steady_clock;
  const auto probeEvery = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.probeIntervalSeconds));
  Clock::time_point nextProbe = Clock::now() + probeEvery;
  epoll_event events[64];
  std::vector<std::shared_ptr<EndpointImpl>> ready;
  while (!stopping.load(std::memory_order_acquire)) {
    int n = ::epoll_wait(epfd, events, 64, sleepMs(nextProbe, probeEvery));
    if (n < 0 && errno != EINTR) {
      FERRY_LOG(kError, "endpoint worker %d: epoll_wait: %s", options.id, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    collectReady(events, n, ready);
    // Outside the lock: an endpoint whose last reference goes here detaches (takes the lock).
    for (auto& ep : ready) ep->progressFromWorker();
    ready.clear();

    if (options.probeIntervalSeconds > 0 && Clock::now() >= nextProbe) {
      nextProbe = Clock::now() + probeEvery;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& [key, entry] : entries) {
          if (!entry.raw->wantsProbe()) continue;
          if (auto ep = entry.endpoint.lock()) ready.push_back(std::move(ep));
        }
      }
      for (auto& ep : ready) ep->probeFromWorker();
      ready.clear();
    }
  }
}

int Worker::State::sleepMs(std::chrono::steady_clock::time_point& nextProbe,
                           std::chrono::steady_clock::duration probeEvery) {
  using Clock = std::chrono::steady_clock;
  // Sleep without a timeout unless an endpoint has a receive waiting (then probe its peer), or
  // a CQ left unarmed while its waiters poll (then look again when their lease ends).
  int timeoutMs = -1;
  std::lock_guard<std::mutex> lock(mu);
  bool probing = false;
  const int64_t nowNs = steadyNs();
  for (const auto& [key, entry] : entries) {
    probing = probing || (options.probeIntervalSeconds > 0 && entry.raw->wantsProbe());
    if (std::optional<int64_t> due = entry.raw->unarmedDueNs(nowNs)) {
      const int64_t ms = (std::max<int64_t>(*due - nowNs, 0) + 999'999) / 1'000'000;
      timeoutMs = timeoutMs < 0 ? static_cast<int>(ms) : std::min(timeoutMs, static_cast<int>(ms));
    }
  }
  if (probing) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(nextProbe - Clock::now()).count();
    const int probeMs = static_cast<int>(std::max<int64_t>(left, 0));
    timeoutMs = timeoutMs < 0 ? probeMs : std::min(timeoutMs, probeMs);
  } else {
    nextProbe = Clock::now() + probeEvery;
  }
  return timeoutMs;
}

void Worker::State::collectReady(const epoll_event* events, int n,
                                 std::vector<std::shared_ptr<EndpointImpl>>& ready) {
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < n; ++i) {
    uint64_t key = events[i].data.u64;
    if (key == 0) {
      uint64_t value;
      ssize_t r = ::read(wakefd, &value, sizeof value);
      (void)r;
      continue;
    }
    auto it = entries.find(key);
    if (it == entries.end()) continue;
    if (auto ep = it->second.endpoint.lock()) ready.push_back(std::move(ep));
  }
  // CQs left unarmed whose pollers stopped: take what is there and arm them (or, while the
  // pollers still attend, look again later).
  const int64_t nowNs = steadyNs();
  for (const auto& [key, entry] : entries) {
    std::optional<int64_t> due = entry.raw->unarmedDueNs(nowNs);
    if (!due || *due > nowNs) continue;
    auto ep = entry.endpoint.lock();
    if (ep && std::find(ready.begin(), ready.end(), ep) == ready.end()) ready.push_back(std::move(ep));
  }
}

Result<std::shared_ptr<Worker>> Worker::create(WorkerOptions options) {
  if (options.probeIntervalSeconds < 0) return invalidArgument("Worker: negative probe interval");
  auto state = std::make_shared<State>();
  state->options = options;
  state->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (state->epfd < 0) return ioError("Worker: epoll_create1");
  state->wakefd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (state->wakefd < 0) return ioError("Worker: eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (::epoll_ctl(state->epfd, EPOLL_CTL_ADD, state->wakefd, &ev) != 0) return ioError("Worker: epoll_ctl");
  return std::shared_ptr<Worker>(new Worker(std::move(state)));
}

Result<std::shared_ptr<Worker>> Worker::forDevice(const std::string& deviceName, int id) {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> names, availableNics());
  bool known = false;
  for (const auto& n : names) known = known || n == deviceName;
  if (!known) return notFound("Worker: no device '" + deviceName + "'");
  return create({.socketId = endpoint::socketId(deviceName), .id = id});
}

Worker::~Worker() { stop(); }

Status Worker::start() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopped) return closedError("Worker: stopped");
  if (state_->started) return Status::ok();
  state_->started = true;
  auto state = state_;
  state_->thread = std::thread([state] { state->run(); });
  return Status::ok();
}

void Worker::stop() {
  std::vector<std::shared_ptr<EndpointImpl>> endpoints;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stopped) return;
    state_->stopped = true;
    for (const auto& [key, entry] : state_->entries) {
      if (auto ep = entry.endpoint.lock()) endpoints.push_back(std::move(ep));
    }
  }
  // Their pending operations fail now rather than never.
  for (auto& ep : endpoints) ep->shutdown();
  endpoints.clear();
  state_->stopping.store(true, std::memory_order_release);
  state_->wake();
  if (state_->thread.joinable()) {
    if (state_->thread.get_id() == std::this_thread::get_id()) {
      state_->thread.detach();  // the loop ends on its own; it holds the state
    } else {
      state_->thread.join();
    }
  }
}

Status Worker::attach(const std::shared_ptr<EndpointImpl>& endpoint) {
  FERRY_RETURN_IF_ERROR(start());
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopped) return closedError("Worker: stopped");
  if (state_->keys.count(endpoint.get()) != 0) return Status::ok();
  uint64_t key = state_->nextKey++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = key;
  if (::epoll_ctl(state_->epfd, EPOLL_CTL_ADD, endpoint->channel_.fd(), &ev) != 0) {
    return ioError("Worker: epoll_ctl(ADD) of an endpoint's completion channel");
  }
  state_->entries[key] = State::Entry{endpoint, endpoint.get()};
  state_->keys[endpoint.get()] = key;
  state_->wake();  // recompute the probe timer
  return Status::ok();
}

void Worker::detach(const EndpointImpl* endpoint) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->keys.find(endpoint);
  if (it == state_->keys.end()) return;
  // The channel fd is still open here (the endpoint closes it after detaching).
  ::epoll_ctl(state_->epfd, EPOLL_CTL_DEL, endpoint->channel_.fd(), nullptr);
  state_->entries.erase(it->second);
  state_->keys.erase(it);
}

void Worker::wake() { state_->wake(); }

Status Worker::addEndpoint(const std::shared_ptr<Endpoint>& endpoint) {
  if (!endpoint) return invalidArgument("add_endpoint: no endpoint");
  // Every Endpoint is an EndpointImpl (its constructor is for EndpointImpl alone).
  return std::static_pointer_cast<EndpointImpl>(endpoint)->moveToWorker(shared_from_this());
}

int Worker::socketId() const { return state_->options.socketId; }
int Worker::id() const { return state_->options.id; }

size_t Worker::endpointCount() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->entries.size();
}

bool Worker::running() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->started && !state_->stopped;
}

}  // namespace ferry::endpoint
