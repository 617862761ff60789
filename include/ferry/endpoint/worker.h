// Worker: the progress thread of one or more endpoints (the document's RDMAWorker).
//
// A worker's thread sleeps in epoll_wait on the completion channels of its endpoints (and an
// eventfd for wake-ups); when a completion arrives it polls that endpoint's completion queue,
// completes operations, refills receives and posts work that waited for queue space. An idle worker
// costs no CPU: it only wakes for completions, and once a second per endpoint that has a recv() or
// immRecv() waiting (to probe the peer, so that a dead peer fails those waits too).
//
// An endpoint created without a worker gets a worker of its own. The thread starts with the first
// endpoint (or start()) and is pinned to the CPUs of its NUMA node when one was given.
//
// Thread safety: every method may be called from any thread. stop() and the destructor may not be
// called from the worker's own thread by user code (there is no user code on it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/common/status.h"

namespace ferry::endpoint {

class Endpoint;
class EndpointImpl;

struct WorkerOptions {
  // The NUMA node whose CPUs the thread runs on; -1: no pinning. A worker made for a device takes
  // the device's node.
  int socketId = -1;
  int id = 0;  // a number of the caller's choosing, for logs and thread names
  // Seconds between liveness probes while a recv() or immRecv() waits (0: none).
  double probeIntervalSeconds = 1.0;
};

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  static Result<std::shared_ptr<Worker>> create(WorkerOptions options = {});
  // A worker on the NUMA node of a device (kNotFound for an unknown device).
  static Result<std::shared_ptr<Worker>> forDevice(const std::string& deviceName, int id = 0);

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  // stop().
  ~Worker();

  // Starts the thread (idempotent; attaching an endpoint starts it too). kClosed after stop().
  Status start();
  // Shuts down every endpoint it progresses (their pending operations fail with kCancelled),
  // then ends the thread. Idempotent; returns when the thread has exited.
  void stop();
  // Moves an endpoint to this worker (from its own or another worker). kClosed when this worker
  // was stopped or the endpoint was shut down.
  Status addEndpoint(const std::shared_ptr<Endpoint>& endpoint);

  int socketId() const;
  int id() const;
  size_t endpointCount() const;
  bool running() const;

  struct State;  // shared with the thread; defined in worker.cc

 private:
  friend class EndpointImpl;
  explicit Worker(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // For Endpoint: start following an endpoint's completion channel / stop following it.
  Status attach(const std::shared_ptr<EndpointImpl>& endpoint);
  void detach(const EndpointImpl* endpoint);
  // For Endpoint: a recv()/immRecv() started waiting; re-arm the probe timer.
  void wake();

  std::shared_ptr<State> state_;
};

}  // namespace ferry::endpoint
