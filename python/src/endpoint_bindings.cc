// ferry._core.endpoint: the Endpoint API's C++ classes for Python. python/ferry/endpoint.py adds the
// document's constructor forms and names on top; the per-operation calls (read, write, send, ...)
// are these, so a batch is turned into work without a Python-level loop.
//
// The GIL is released while posting and while waiting; a wait wakes every 100 ms to let Python
// handle signals (Ctrl-C interrupts a wait, the operation goes on).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/endpoint/endpoint.h"
#include "memory_args.h"
#include "status.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

using endpoint::Assignment;
using endpoint::Chunk;
using endpoint::Endpoint;
using endpoint::MemoryPool;
using endpoint::MrHandle;
using endpoint::OpKind;
using endpoint::RdmaContext;
using endpoint::Worker;

// A region key as a handle: an int is the handle, a str a name looked up (the last one is cached).
class KeyResolver {
 public:
  KeyResolver(const Endpoint& ep, bool remote) : ep_(ep), remote_(remote) {}
  MrHandle resolve(PyObject* key, size_t index) {
    if (PyUnicode_Check(key)) {
      if (key == lastKey_) return lastHandle_;
      Py_ssize_t size = 0;
      const char* text = PyUnicode_AsUTF8AndSize(key, &size);
      if (text == nullptr) {
        PyErr_Clear();
        raiseInvalid("region name of item " + std::to_string(index) + " is not valid text");
      }
      std::string_view name(text, static_cast<size_t>(size));
      auto handle = remote_ ? ep_.remoteHandle(name) : ep_.localHandle(name);
      if (!handle.isOk()) raiseInvalid("item " + std::to_string(index) + ": " + handle.status().message());
      lastKey_ = key;
      lastHandle_ = *handle;
      return *handle;
    }
    return toU64(key, remote_ ? "remote_mr_key" : "mr_key", index);
  }

 private:
  const Endpoint& ep_;
  bool remote_;
  PyObject* lastKey_ = nullptr;  // borrowed: alive as long as the batch is
  MrHandle lastHandle_ = 0;
};

// "Q", "<Q", "=Q", "q", "L" (8-byte on LP64), ...: one 8-byte integer.
bool isU64Format(std::string_view f) {
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.remove_prefix(1);
  return f == "Q" || f == "q" || f == "L" || f == "l";
}

// NumPy's format of a structured dtype: "T{<Q:mr_key:<Q:remote_mr_key:...:}". True when it has
// exactly five 8-byte integer fields.
bool isFiveU64Struct(std::string_view f) {
  if (f.size() < 3 || f.substr(0, 2) != "T{" || f.back() != '}') return false;
  f = f.substr(2, f.size() - 3);
  int fields = 0;
  while (!f.empty()) {
    size_t colon = f.find(':');
    if (colon == std::string_view::npos) return false;
    if (!isU64Format(f.substr(0, colon))) return false;
    f.remove_prefix(colon + 1);
    size_t end = f.find(':');
    if (end == std::string_view::npos) return false;
    f.remove_prefix(end + 1);
    ++fields;
  }
  return fields == 5;
}

Assignment tupleToAssignment(OpKind kind, MrHandle local, MrHandle remote, uint64_t target, uint64_t source,
                             uint64_t length) {
  return endpoint::fromTuple(kind, local, remote, target, source, length);
}

// A batch of assignments from Python: a list of (mr_key, remote_mr_key, target_offset,
// source_offset, length) tuples or ferry.Assignment objects, or an array (N x 5 of 8-byte integers,
// or a structured array of five such fields) in the tuple's column order.
std::vector<Assignment> toBatch(const Endpoint& ep, py::handle batch, OpKind kind) {
  std::vector<Assignment> out;
  PyObject* obj = batch.ptr();
  // One assignment given alone, (mr_key, remote_mr_key, target_offset, source_offset, length), as
  // DLSlime's users write it: a batch of one.
  py::list single;
  // Its first field is a key (an int or a name); a tuple of five ferry.Assignment objects is a batch.
  if (PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == 5 &&
      (PyLong_Check(PyTuple_GET_ITEM(obj, 0)) || PyUnicode_Check(PyTuple_GET_ITEM(obj, 0)))) {
    single.append(batch);
    obj = single.ptr();
  }
  if (!PyList_Check(obj) && !PyTuple_Check(obj) && PyObject_CheckBuffer(obj)) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      raiseInvalid("an array batch must be C-contiguous");
    }
    std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
    std::string_view format = view.format ? view.format : "B";
    size_t rows = 0;
    if (view.ndim == 2 && view.itemsize == 8 && isU64Format(format) && view.shape[1] == 5) {
      rows = static_cast<size_t>(view.shape[0]);
    } else if (view.ndim == 1 && view.itemsize == 40 && isFiveU64Struct(format)) {
      rows = static_cast<size_t>(view.shape[0]);
    } else {
      raiseInvalid(
          "an array batch must be N x 5 of 8-byte integers or a structured array of five 8-byte integer "
          "fields (ferry.assignment_dtype), not format '" +
          std::string(format) + "' with " + std::to_string(view.ndim) + " dimension(s)");
    }
    const bool isSigned = format.back() == 'q' || format.back() == 'l';
    const auto* words = static_cast<const uint64_t*>(view.buf);
    out.reserve(rows);
    for (size_t i = 0; i < rows; ++i) {
      const uint64_t* w = words + i * 5;
      if (isSigned) {
        for (int k = 0; k < 5; ++k) {
          if (static_cast<int64_t>(w[k]) < 0)
            raiseInvalid("row " + std::to_string(i) + " has a negative value");
        }
      }
      out.push_back(tupleToAssignment(kind, w[0], w[1], w[2], w[3], w[4]));
    }
    return out;
  }

  PyObject* seq = PySequence_Fast(obj, "a batch must be a list of assignment tuples or an array");
  if (seq == nullptr) throw py::error_already_set();
  std::unique_ptr<PyObject, void (*)(PyObject*)> seqRef(seq, [](PyObject* p) { Py_DECREF(p); });
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out.reserve(static_cast<size_t>(n));
  KeyResolver local(ep, false), remote(ep, true);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    const size_t idx = static_cast<size_t>(i);
    if (PyTuple_Check(item) || PyList_Check(item)) {
      if (PySequence_Fast_GET_SIZE(item) != 5) {
        raiseInvalid("assignment " + std::to_string(idx) +
                     " must have 5 fields (mr_key, remote_mr_key, target_offset, source_offset, length)");
      }
      PyObject** f = PySequence_Fast_ITEMS(item);
      out.push_back(tupleToAssignment(kind, local.resolve(f[0], idx), remote.resolve(f[1], idx),
                                      toU64(f[2], "target_offset", idx), toU64(f[3], "source_offset", idx),
                                      toU64(f[4], "length", idx)));
      continue;
    }
    // A ferry.Assignment (named fields).
    py::handle h(item);
    if (!py::hasattr(h, "local") || !py::hasattr(h, "remote")) {
      raiseInvalid("assignment " + std::to_string(idx) + " is neither a 5-tuple nor a ferry.Assignment");
    }
    py::object l = h.attr("local"), r = h.attr("remote");
    py::object lo = h.attr("local_offset"), ro = h.attr("remote_offset"), len = h.attr("length");
    out.push_back(Assignment{.local = local.resolve(l.ptr(), idx),
                             .remote = remote.resolve(r.ptr(), idx),
                             .localOffset = toU64(lo.ptr(), "local_offset", idx),
                             .remoteOffset = toU64(ro.ptr(), "remote_offset", idx),
                             .length = toU64(len.ptr(), "length", idx)});
  }
  return out;
}

// Chunks of a message: a (mr_key, offset, length) tuple or a list of them.
std::vector<Chunk> toChunks(const Endpoint& ep, py::handle chunks) {
  std::vector<Chunk> out;
  PyObject* obj = chunks.ptr();
  auto isChunk = [](PyObject* o) {
    if (!PyTuple_Check(o) && !PyList_Check(o)) return false;
    if (PySequence_Fast_GET_SIZE(o) != 3) return false;
    PyObject* first = PySequence_Fast_ITEMS(o)[0];
    return !PyTuple_Check(first) && !PyList_Check(first);
  };
  KeyResolver local(ep, false);
  auto one = [&](PyObject* o, size_t idx) {
    if (!isChunk(o))
      raiseInvalid("chunk " + std::to_string(idx) + " must be a (mr_key, offset, length) tuple");
    PyObject** f = PySequence_Fast_ITEMS(o);
    out.push_back(Chunk{.mr = local.resolve(f[0], idx),
                        .offset = toU64(f[1], "offset", idx),
                        .length = toU64(f[2], "length", idx)});
  };
  if (isChunk(obj)) {
    one(obj, 0);
    return out;
  }
  PyObject* seq = PySequence_Fast(obj, "chunks must be a (mr_key, offset, length) tuple or a list of them");
  if (seq == nullptr) throw py::error_already_set();
  std::unique_ptr<PyObject, void (*)(PyObject*)> seqRef(seq, [](PyObject* p) { Py_DECREF(p); });
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) one(PySequence_Fast_ITEMS(seq)[i], static_cast<size_t>(i));
  return out;
}

MrHandle registerInPool(MemoryPool& pool, py::handle key, py::handle target, uint64_t offset,
                        py::handle length) {
  Memory m = toMemory(target, offset, length);
  Result<MrHandle> h = Status(StatusCode::kInternal, "unset");
  if (PyUnicode_Check(key.ptr())) {
    std::string name = key.cast<std::string>();
    py::gil_scoped_release release;
    h = pool.registerMemoryRegion(name, m.addr, m.length, std::move(m.options));
  } else {
    uint64_t k = toU64(key.ptr(), "key", 0);
    py::gil_scoped_release release;
    h = pool.registerMemoryRegion(k, m.addr, m.length, std::move(m.options));
  }
  return unwrap(std::move(h));
}

void unregisterInPool(MemoryPool& pool, py::handle key) {
  if (PyUnicode_Check(key.ptr())) {
    check(pool.unregisterMemoryRegion(key.cast<std::string>()));
  } else {
    check(pool.unregisterMemoryRegion(static_cast<MrHandle>(toU64(key.ptr(), "key", 0))));
  }
}

std::shared_ptr<Endpoint> makeEndpoint(py::object context, py::object pool, const std::string& deviceName,
                                       int ibPort, const std::string& linkType, size_t numQp,
                                       std::shared_ptr<Worker> worker, std::optional<uint32_t> sendDepth,
                                       std::optional<uint32_t> recvDepth,
                                       std::optional<uint32_t> recvBufferSize, uint8_t gidIndex) {
  endpoint::EndpointOptions o;
  o.numQp = numQp;
  o.worker = std::move(worker);
  if (sendDepth) o.sendDepth = *sendDepth;
  if (recvDepth) o.recvDepth = *recvDepth;
  if (recvBufferSize) o.recvBufferSize = *recvBufferSize;
  o.gidIndex = gidIndex;
  Result<std::shared_ptr<Endpoint>> ep = Status(StatusCode::kInternal, "unset");
  if (!pool.is_none()) {
    auto p = pool.cast<std::shared_ptr<MemoryPool>>();
    py::gil_scoped_release release;
    ep = Endpoint::create(std::move(p), std::move(o));
  } else if (!context.is_none()) {
    auto c = context.cast<std::shared_ptr<RdmaContext>>();
    py::gil_scoped_release release;
    ep = Endpoint::create(std::move(c), std::move(o));
  } else {
    py::gil_scoped_release release;
    ep = Endpoint::create(
        endpoint::ContextOptions{.deviceName = deviceName, .ibPort = ibPort, .linkType = linkType},
        std::move(o));
  }
  // Raised with the GIL held.
  return unwrap(std::move(ep));
}

// Memory given by raw address, as DLSlime's users write `(tensor.data_ptr(), offset, length)`:
// a local key at or above kNamedHandleBase (2^31, where the addresses of a 64-bit process's heap
// and mappings lie) that is no registered region's handle is the address of memory registered for
// this one operation. Each address is registered once per operation, over the furthest byte the
// operation reaches, unpublished and with no remote access, and unregistered when the operation
// completes (or at once when it cannot be submitted). The memory must stay valid until then, as
// with any registered memory.
class RawRegions {
 public:
  explicit RawRegions(std::shared_ptr<endpoint::MemoryPool> pool, bool writable)
      : pool_(std::move(pool)), writable_(writable) {}
  RawRegions(const RawRegions&) = delete;
  RawRegions& operator=(const RawRegions&) = delete;
  ~RawRegions() { release(pool_, std::move(handles_)); }

  // Whether key needs a registration of its own (call with every local key, then register()).
  void note(MrHandle key, uint64_t offset, uint64_t length) {
    if (key < endpoint::kNamedHandleBase || key == lastRegistered_) return;
    if (extent_.count(key) == 0 && pool_->find(key).isOk()) {  // a registered region (a named one)
      lastRegistered_ = key;  // batches name few regions many times: look each up once in a row
      return;
    }
    uint64_t end = offset + length;
    if (end < offset)
      raiseInvalid("memory at address " + std::to_string(key) + ": offset + length overflows");
    uint64_t& extent = extent_[key];
    extent = std::max(extent, std::max<uint64_t>(end, 1));
  }
  // Registers every noted address; returns the handle each maps to (GIL released by the caller).
  Status registerAll() {
    static std::atomic<uint64_t> serial{0};
    for (const auto& [addr, extent] : extent_) {
      endpoint::RegionOptions o;
      o.writable = writable_;
      o.remote = endpoint::RegionOptions::Remote::kNone;
      o.published = false;
      std::string name = "raw:" + std::to_string(addr) + ":" + std::to_string(serial.fetch_add(1));
      auto h = pool_->registerMemoryRegion(name, reinterpret_cast<void*>(addr), extent, std::move(o));
      if (!h.isOk()) {
        return Status(h.status().code(), "memory at address 0x" + toHex(addr) +
                                             " is not a registered region and could not be registered for "
                                             "this operation: " +
                                             h.status().message());
      }
      handles_.push_back(*h);
      mapped_[addr] = *h;
    }
    return Status::ok();
  }
  bool empty() const { return extent_.empty(); }
  MrHandle map(MrHandle key) const {
    auto it = mapped_.find(key);
    return it == mapped_.end() ? key : it->second;
  }
  // Unregisters the regions once the operation is done.
  void releaseWhenDone(const endpoint::Future& f) {
    if (handles_.empty()) return;
    auto pool = pool_;
    auto handles = std::make_shared<std::vector<MrHandle>>(std::move(handles_));
    handles_.clear();
    f.state()->onDone([pool, handles](const Completion&) { release(pool, std::move(*handles)); });
  }

 private:
  static void release(const std::shared_ptr<endpoint::MemoryPool>& pool, std::vector<MrHandle> handles) {
    for (MrHandle h : handles) (void)pool->unregisterMemoryRegion(h);
  }
  static std::string toHex(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
    return buf;
  }
  std::shared_ptr<endpoint::MemoryPool> pool_;
  bool writable_;
  MrHandle lastRegistered_ = 0;  // the last key found registered (0: none; keys start at 2^31 here)
  std::map<MrHandle, uint64_t> extent_;
  std::map<MrHandle, MrHandle> mapped_;
  std::vector<MrHandle> handles_;
};

// Submits items (assignments or chunks) whose local keys may be raw addresses: `key` names an
// item's local key (a reference to it), `local` gives (offset, length) of its local bytes; the
// addresses are registered, the keys replaced, submit(items) called, all without the GIL.
template <typename F, typename Item, typename Key, typename Local, typename Submit>
F submitWithRaw(const std::shared_ptr<Endpoint>& ep, std::vector<Item>& items, bool writable, Key key,
                Local local, Submit submit) {
  RawRegions raw(ep->pool(), writable);
  for (Item& item : items) {
    auto [offset, length] = local(item);
    raw.note(key(item), offset, length);
  }
  Result<F> f = Status(StatusCode::kInternal, "unset");
  {
    py::gil_scoped_release release;
    Status registered = raw.empty() ? Status::ok() : raw.registerAll();
    if (!registered.isOk()) {
      f = registered;
    } else {
      if (!raw.empty()) {
        for (Item& item : items) key(item) = raw.map(key(item));
      }
      f = submit(items);
      if (f.isOk()) raw.releaseWhenDone(*f);
    }
  }
  return unwrap(std::move(f));
}

template <typename F>
F submitOp(const std::shared_ptr<Endpoint>& ep, py::handle batch, OpKind kind, uint32_t imm = 0) {
  std::vector<Assignment> assignments = toBatch(*ep, batch, kind);
  // The local side of a READ is written; of a WRITE, only read.
  return submitWithRaw<endpoint::ReadWriteFuture>(
      ep, assignments, kind == OpKind::kRead, [](Assignment& a) -> MrHandle& { return a.local; },
      [](const Assignment& a) { return std::pair<uint64_t, uint64_t>(a.localOffset, a.length); },
      [&](const std::vector<Assignment>& list) {
        if (kind == OpKind::kRead) return ep->read(list);
        if (kind == OpKind::kWrite) return ep->write(list);
        return ep->writeWithImm(list, imm);
      });
}

// send() and recv() with the same raw-address chunks.
template <typename F, typename Submit>
F submitMessage(const std::shared_ptr<Endpoint>& ep, py::handle chunks, bool writable, Submit submit) {
  std::vector<Chunk> list = toChunks(*ep, chunks);
  return submitWithRaw<F>(
      ep, list, writable, [](Chunk& c) -> MrHandle& { return c.mr; },
      [](const Chunk& c) { return std::pair<uint64_t, uint64_t>(c.offset, c.length); }, submit);
}

// Tells an event loop, through one file descriptor it watches, which futures completed: the
// completing thread (a worker) appends the future's token and bumps an eventfd; the loop's reader
// drains the tokens. No thread of its own and no polling (ferry/aio.py uses it for `await`).
class DoneNotifier {
 public:
  DoneNotifier() : shared_(std::make_shared<Shared>()) {
    shared_->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (shared_->fd < 0) raiseStatus(ioError("eventfd"));
  }
  int fileno() const { return shared_->fd; }
  // Reports `token` through fileno() once f is done (at once when it is done already).
  void watch(const endpoint::Future& f, uint64_t token) {
    if (!f.valid()) raiseInvalid("watch: an empty future");
    std::weak_ptr<Shared> weak = shared_;
    f.state()->onDone([weak, token](const Completion&) {
      if (auto s = weak.lock()) s->push(token);
    });
  }
  // The tokens of the futures done since the last call (clears the descriptor's readiness).
  std::vector<uint64_t> drain() {
    uint64_t count = 0;
    ssize_t n = ::read(shared_->fd, &count, sizeof count);
    (void)n;
    std::lock_guard<std::mutex> lock(shared_->mu);
    std::vector<uint64_t> out;
    out.swap(shared_->done);
    return out;
  }

 private:
  // Outlives the notifier while a completion callback still holds it.
  struct Shared {
    std::mutex mu;
    std::vector<uint64_t> done;
    int fd = -1;
    ~Shared() {
      if (fd >= 0) ::close(fd);
    }
    void push(uint64_t token) {
      {
        std::lock_guard<std::mutex> lock(mu);
        done.push_back(token);
      }
      uint64_t one = 1;
      ssize_t n = ::write(fd, &one, sizeof one);
      (void)n;
    }
  };
  std::shared_ptr<Shared> shared_;
};

// {kind: {"operations", "bytes", "errors", "errors_by_status", "latency_sum_us",
//         "latency_buckets": [(upper_bound_us, count), ...]}} (counts per bucket, not cumulative).
py::dict operationsDict(const std::vector<OpMetrics>& ops) {
  py::dict out;
  for (const OpMetrics& m : ops) {
    py::dict d;
    d["operations"] = m.operations;
    d["bytes"] = m.bytes;
    d["errors"] = m.errors;
    py::dict byStatus;
    for (const auto& [name, n] : m.errorsByStatus) byStatus[py::str(name)] = n;
    d["errors_by_status"] = byStatus;
    d["latency_sum_us"] = m.latencySumUs;
    py::list buckets;
    for (int i = 0; i < kLatencyBuckets; ++i) {
      buckets.append(py::make_tuple(OpMetrics::bucketUpperUs(i), m.latencyBuckets[static_cast<size_t>(i)]));
    }
    d["latency_buckets"] = buckets;
    out[py::str(m.kind)] = d;
  }
  return out;
}

}  // namespace

void bindEndpoint(py::module_& m) {
  m.def(
      "process_stats",
      [] {
        py::list out;
        for (const auto& ctx : RdmaContext::openNow()) {
          py::dict d;
          d["device"] = ctx->deviceName();
          d["ib_port"] = ctx->ibPort();
          d["operations"] = operationsDict(ctx->metrics()->snapshot());
          out.append(d);
        }
        return out;
      },
      "Every context open in this process: device, port and its operations' metrics");
  py::class_<DoneNotifier>(m, "DoneNotifier",
                           "Reports completed futures through a file descriptor an event loop watches.")
      .def(py::init<>())
      .def("fileno", &DoneNotifier::fileno)
      .def("watch", &DoneNotifier::watch, py::arg("future"), py::arg("token"))
      .def("drain", &DoneNotifier::drain);

  m.def(
      "available_nic", [] { return unwrap(endpoint::availableNics()); },
      "The names of every usable device (software devices included), in ferry's device order.");
  m.def(
      "socket_id", [](const std::string& device) { return endpoint::socketId(device); }, py::arg("device"),
      "The NUMA node of a device; 0 where unknown.");

  py::class_<RdmaContext, std::shared_ptr<RdmaContext>>(m, "Context", "An opened device port (RdmaContext).")
      .def(py::init([](const std::string& deviceName, int ibPort, const std::string& linkType) {
             Result<std::shared_ptr<RdmaContext>> ctx = Status(StatusCode::kInternal, "unset");
             {
               py::gil_scoped_release release;
               ctx = RdmaContext::open({.deviceName = deviceName, .ibPort = ibPort, .linkType = linkType});
             }
             return unwrap(std::move(ctx));
           }),
           py::arg("device_name") = "", py::arg("ib_port") = 1, py::arg("link_type") = "RoCE")
      .def_property_readonly("device_name", &RdmaContext::deviceName,
                             "The device's name, as available_nic() reports it.")
      .def_property_readonly("ib_port", &RdmaContext::ibPort,
                             "The port number on the device (1 .. its port count).")
      .def_property_readonly(
          "link_type", &RdmaContext::linkType,
          "'RoCE' for an Ethernet link layer, 'IB' for InfiniBand, else the device's transport name.")
      .def(
          "stats", [](const RdmaContext& c) { return operationsDict(c.metrics()->snapshot()); },
          "Per kind of operation of every endpoint on this context: completed, bytes, errors by status, "
          "latency")
      .def_property_readonly("socket_id", &RdmaContext::socketId,
                             "The NUMA node of the device; 0 where unknown.");

  py::class_<MemoryPool, std::shared_ptr<MemoryPool>>(m, "MemoryPool",
                                                      "Local memory regions shared by endpoints.")
      .def(py::init([](std::shared_ptr<RdmaContext> context) {
             if (!context) raiseInvalid("MemoryPool: a context is needed");
             return unwrap(MemoryPool::create(std::move(context)));
           }),
           py::arg("context"))
      .def(
          "_register",
          [](MemoryPool& pool, py::handle key, py::handle target, uint64_t offset, py::handle length) {
            return registerInPool(pool, key, target, offset, length);
          },
          py::arg("key"), py::arg("target"), py::arg("offset") = 0, py::arg("length") = py::none())
      .def(
          "unregister_memory_region", [](MemoryPool& pool, py::handle key) { unregisterInPool(pool, key); },
          py::arg("key"), "Deregisters a region (by handle or name); its memory may be freed afterwards.")
      .def(
          "get_handle", [](MemoryPool& pool, const std::string& name) { return unwrap(pool.handleOf(name)); },
          py::arg("name"),
          "The handle (int) of the region registered under name; raises ferry.NotFound when there is none.")
      .def("_mr_info_json", &MemoryPool::mrInfo)
      .def_property_readonly("context", &MemoryPool::context,
                             "The Context (device port) the pool's regions are registered on.")
      .def("__len__", &MemoryPool::size);

  py::class_<Worker, std::shared_ptr<Worker>>(m, "Worker", "A progress thread for one or more endpoints.")
      .def(py::init([](int id) { return unwrap(Worker::create({.socketId = -1, .id = id})); }),
           py::arg("id") = 0)
      .def(py::init([](const std::string& device, int id) { return unwrap(Worker::forDevice(device, id)); }),
           py::arg("dev_name"), py::arg("id") = 0)
      .def(
          py::init([](int socket, int id) { return unwrap(Worker::create({.socketId = socket, .id = id})); }),
          py::arg("socket_id"), py::arg("id"))
      .def(
          "start",
          [](Worker& w) {
            check(w.start());
            return 0;
          },
          "Starts the progress thread (idempotent; attaching an endpoint starts it too). Returns 0; raises "
          "ferry.Closed after stop().")
      .def("stop", &Worker::stop, py::call_guard<py::gil_scoped_release>(),
           "Shuts down every endpoint this worker progresses (their pending futures raise ferry.Cancelled), "
           "then ends the thread. Idempotent; returns when the thread has exited (without holding the GIL).")
      .def(
          "add_endpoint",
          [](Worker& w, const std::shared_ptr<Endpoint>& ep) {
            Status st;
            {
              py::gil_scoped_release release;
              st = w.addEndpoint(ep);
            }
            check(st);
          },
          py::arg("endpoint"),
          "Moves an endpoint to this worker (from its own worker or another). Raises ferry.Closed when this "
          "worker was stopped or the endpoint was shut down.")
      .def_property_readonly("socket_id", &Worker::socketId,
                             "The NUMA node whose CPUs the thread runs on; -1: not pinned.")
      .def_property_readonly("id", &Worker::id, "The number given at creation (for logs and thread names).")
      .def_property_readonly("running", &Worker::running,
                             "Whether the progress thread is running (started and not stopped).")
      .def("__len__", &Worker::endpointCount);

  py::class_<endpoint::Future>(m, "Future", "An asynchronous operation of an endpoint.")
      .def(
          "wait", [](const endpoint::Future& f, py::object timeout) { return waitFuture(f, timeout); },
          py::arg("timeout") = py::none(),
          "Waits for the operation (timeout in seconds; None: until it completes). Returns 0; raises the "
          "operation's error (ferry.WorkCompletionError, ferry.Cancelled, ...) or ferry.TimedOut.")
      .def(
          "done", &endpoint::Future::done,
          "Whether the operation completed (with success or an error); never blocks, and takes no completion "
          "itself: another thread must have taken it (poll() takes the completions that are there).")
      .def(
          "check",
          [](const endpoint::Future& f) {
            if (!f.done()) return false;
            check(f.status());
            return true;
          },
          "Whether the operation completed; raises its error when it completed with one. Never blocks and "
          "takes no completion (poll() does): done() and wait(0) in one call.")
      .def("poll", &endpoint::Future::poll, py::call_guard<py::gil_scoped_release>(),
           "Takes the completions that are there once, on this thread, without blocking, and returns whether "
           "the "
           "operation is done: the step of a poll loop, which completes an operation without waking the "
           "endpoint's thread.")
      .def("__repr__", [](const endpoint::Future& f) {
        std::string state = !f.done()           ? "pending"
                            : f.status().isOk() ? "done"
                                                : "failed: " + f.status().message();
        return "<ferry future " + state + ">";
      });
  py::class_<endpoint::ReadWriteFuture, endpoint::Future>(
      m, "ReadWriteFuture",
      "The future of read(), write() and write_with_imm(): done when every byte of the batch is placed (in "
      "local memory for a READ, at the peer for a WRITE). wait() returns 0, and so does await. It completes "
      "once, on the endpoint's worker thread or on a thread waiting for it: with success, the operation's "
      "error, ferry.Cancelled (shutdown) or the endpoint's failure.");
  py::class_<endpoint::SendFuture, endpoint::Future>(
      m, "SendFuture",
      "The future of send(): done when the whole message is in the peer's receive buffers. wait() returns 0,"
      " and so does await. It completes once, on the endpoint's worker thread or on a thread waiting for it:"
      " with success, the operation's error, ferry.Cancelled (shutdown) or the endpoint's failure.");
  py::class_<endpoint::RecvFuture, endpoint::Future>(
      m, "RecvFuture",
      "The future of recv(): done when a whole message is in the chunks; nbytes() is its length in bytes, "
      "which await gives. A message longer than the chunks fails it with ferry.InvalidArgument. It completes"
      " once, on the endpoint's worker thread or on a thread waiting for it: with success, the operation's "
      "error, ferry.Cancelled (shutdown) or the endpoint's failure.")
      .def("nbytes", &endpoint::RecvFuture::bytes, "The received message's length (once done).");
  py::class_<endpoint::ImmRecvFuture, endpoint::Future>(
      m, "ImmRecvFuture",
      "The future of imm_recv(): done when the peer's next write_with_imm (in the order the peer issued "
      "them) has placed all its data here; imm_data() is the immediate (unsigned 32-bit), which await gives."
      " It completes once, on the endpoint's worker thread or on a thread waiting for it: with success, the "
      "operation's error, ferry.Cancelled (shutdown) or the endpoint's failure.")
      .def("imm_data", &endpoint::ImmRecvFuture::immData, "The immediate value (once done).");

  py::class_<Endpoint, std::shared_ptr<Endpoint>>(m, "Endpoint",
                                                  "One connection to a peer (see ferry.RDMAEndpoint).")
      .def(py::init(&makeEndpoint), py::kw_only(), py::arg("context") = py::none(),
           py::arg("pool") = py::none(), py::arg("device_name") = "", py::arg("ib_port") = 1,
           py::arg("link_type") = "RoCE", py::arg("num_qp") = 1, py::arg("worker") = nullptr,
           py::arg("send_depth") = py::none(), py::arg("recv_depth") = py::none(),
           py::arg("recv_buffer_size") = py::none(), py::arg("gid_index") = 0)
      .def(
          "_register",
          [](Endpoint& ep, py::handle key, py::handle target, uint64_t offset, py::handle length) {
            return registerInPool(*ep.pool(), key, target, offset, length);
          },
          py::arg("key"), py::arg("target"), py::arg("offset") = 0, py::arg("length") = py::none())
      .def(
          "unregister_memory_region", [](Endpoint& ep, py::handle key) { unregisterInPool(*ep.pool(), key); },
          py::arg("key"),
          "Deregisters a region of the endpoint's pool (by handle or name): once it returns the device no "
          "longer touches the memory, which may be freed. Raises ferry.NotFound for an unknown one.")
      .def(
          "_register_remote",
          [](Endpoint& ep, const std::string& name, const std::string& info) {
            return unwrap(ep.registerRemoteMemoryRegion(name, info));
          },
          py::arg("name"), py::arg("info"))
      .def("_endpoint_info_json", &Endpoint::endpointInfo)
      .def("_mr_info_json", &Endpoint::mrInfo)
      .def("_connect",
           [](Endpoint& ep, const std::string& info) {
             Status st;
             {
               py::gil_scoped_release release;
               st = ep.connect(info);
             }
             check(st);
           })
      .def(
          "read",
          [](const std::shared_ptr<Endpoint>& ep, py::handle assign, py::handle stream) {
            return submitOp<endpoint::ReadWriteFuture>(ep, assign, OpKind::kRead);
          },
          py::arg("assign"), py::arg("stream") = py::none(),
          "READ a batch: [(mr_key, remote_mr_key, target_offset, source_offset, length), ...] where the "
          "target is "
          "local. Returns a ReadWriteFuture.")
      .def(
          "write",
          [](const std::shared_ptr<Endpoint>& ep, py::handle assign, py::handle stream) {
            return submitOp<endpoint::ReadWriteFuture>(ep, assign, OpKind::kWrite);
          },
          py::arg("assign"), py::arg("stream") = py::none(),
          "WRITE a batch: [(mr_key, remote_mr_key, target_offset, source_offset, length), ...] where the "
          "target is "
          "remote. Returns a ReadWriteFuture.")
      .def(
          "write_with_imm",
          [](const std::shared_ptr<Endpoint>& ep, py::handle assign, py::handle imm, py::handle stream) {
            return submitOp<endpoint::ReadWriteFuture>(ep, assign, OpKind::kWriteWithImm, toImm(imm));
          },
          py::arg("assign"), py::arg("imm_data") = 0, py::arg("stream") = py::none(),
          "write() whose immediate the peer's imm_recv() gets once all the data is in place.")
      .def(
          "send",
          [](const std::shared_ptr<Endpoint>& ep, py::handle chunks, py::handle stream) {
            return submitMessage<endpoint::SendFuture>(
                ep, chunks, false, [&](const std::vector<Chunk>& l) { return ep->send(l); });
          },
          py::arg("chunk"), py::arg("stream_handler") = py::none(),
          "Sends one message gathered from [(mr_key, offset, length), ...].")
      .def(
          "recv",
          [](const std::shared_ptr<Endpoint>& ep, py::handle chunks, py::handle stream) {
            return submitMessage<endpoint::RecvFuture>(
                ep, chunks, true, [&](const std::vector<Chunk>& l) { return ep->recv(l); });
          },
          py::arg("chunk"), py::arg("stream_handler") = py::none(),
          "Receives the next message into [(mr_key, offset, length), ...].")
      .def(
          "imm_recv",
          [](const std::shared_ptr<Endpoint>& ep, py::handle stream) {
            Result<endpoint::ImmRecvFuture> f = Status(StatusCode::kInternal, "unset");
            {
              py::gil_scoped_release release;
              f = ep->immRecv();
            }
            return unwrap(std::move(f));
          },
          py::arg("stream") = py::none(), "The peer's next write_with_imm immediate.")
      .def("shutdown", static_cast<void (Endpoint::*)()>(&Endpoint::shutdown),
           py::call_guard<py::gil_scoped_release>(),
           "Fails every pending operation with ferry.Cancelled and releases the queue pairs. Idempotent.")
      .def(
          "local_handle",
          [](const Endpoint& ep, const std::string& name) { return unwrap(ep.localHandle(name)); },
          py::arg("name"),
          "The handle (int) of the local region registered under name; raises ferry.NotFound when none.")
      .def(
          "remote_handle",
          [](const Endpoint& ep, const std::string& name) { return unwrap(ep.remoteHandle(name)); },
          py::arg("name"),
          "The handle (int) of the peer's region recorded under name (by connect() from the peer's mr_info, "
          "or registered as a remote region); raises ferry.NotFound when none.")
      .def_property_readonly(
          "num_qp", &Endpoint::numQp,
          "The number of reliable-connected queue pairs (1 .. 64); both peers use the same.")
      .def_property_readonly("connected", &Endpoint::connected,
                             "Whether connect() succeeded and the endpoint is not shut down.")
      .def_property_readonly(
          "is_shutdown", &Endpoint::isShutdown,
          "Whether the endpoint was shut down (shutdown(), its worker's stop()); its operations then fail.")
      .def("get_pool", &Endpoint::pool,
           "The MemoryPool holding this endpoint's local regions (shared with the endpoints given the same "
           "pool).")
      .def_property_readonly("context", &Endpoint::context,
                             "The Context (device port) of the endpoint's queue pairs.")
      .def_property_readonly("worker", &Endpoint::worker, "The Worker whose thread progresses this endpoint.")
      .def(
          "stats",
          [](const Endpoint& ep) {
            endpoint::EndpointStats s = ep.stats();
            py::list qps;
            for (const auto& l : s.qps) {
              py::dict d;
              d["work_requests"] = l.workRequests;
              d["bytes"] = l.bytes;
              d["max_outstanding"] = l.maxOutstanding;
              d["receives_posted"] = l.receivesPosted;
              qps.append(d);
            }
            py::dict out;
            out["operations"] = operationsDict(s.operations);
            out["qps"] = qps;
            out["operations_queued"] = s.operationsQueued;
            out["unexpected_bytes"] = s.unexpectedBytes;
            out["immediates_queued"] = s.immediatesQueued;
            out["worker_wakeups"] = s.workerWakeups;
            return out;
          },
          "Counters of this endpoint: 'operations' (per kind: operations, bytes, errors, errors_by_status, "
          "latency_sum_us and latency_buckets as (upper bound in us, count)), 'lanes' (per queue pair: "
          "work_requests, bytes, max_outstanding, receives_posted), 'operations_queued', 'unexpected_bytes' "
          "(messages held before their recv()), 'immediates_queued' and 'worker_wakeups' (the times the "
          "worker "
          "took the endpoint's completions).");
}

}  // namespace ferry::python
