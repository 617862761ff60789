// ferry._core.objects: the object store and its client (include/ferry/objects/store.h) for Python.
// python/ferry/objects.py shapes it (ObjectStore and ObjectClient as context managers).
//
// Payloads are never copied here: put() hands the client the memory of the caller's buffer (bytes,
// bytearray, memoryview, mmap, a NumPy array, a CPU or CUDA tensor), get_into() its writable memory,
// and get() fills the bytes object it returns in place. Every call that may wait runs without the
// GIL; the progress callable is called with it, on the thread that made the call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ferry/objects/store.h"
#include "memory_args.h"
#include "status.h"

namespace ferry::python {
namespace {

using objects::ClientOptions;
using objects::ObjectClient;
using objects::ObjectInfo;
using objects::ObjectStore;
using objects::StoreOptions;

// The memory of a contiguous buffer object or of a CPU or CUDA tensor (the client copies CUDA
// memory through the driver), exported (or referenced) until destroyed, which happens with the GIL.
class Payload {
 public:
  Payload(py::handle obj, bool writable, const char* what) {
    PyObject* o = obj.ptr();
    const std::string name = std::string(what) + ": ";
    if (PyObject_CheckBuffer(o)) {
      Py_buffer view;
      if (PyObject_GetBuffer(o, &view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_ANY_CONTIGUOUS) != 0) {
        PyErr_Clear();
        if (writable && PyObject_GetBuffer(o, &view, PyBUF_ANY_CONTIGUOUS) == 0) {
          PyBuffer_Release(&view);
          raiseInvalid(name + "the " + Py_TYPE(o)->tp_name + " is read-only");
        }
        PyErr_Clear();
        raiseInvalid(name + "the " + Py_TYPE(o)->tp_name + " is not a contiguous buffer");
      }
      view_ = view;
      data = view.buf;
      size = static_cast<uint64_t>(view.len);
      return;
    }
    if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "numel") && py::hasattr(obj, "element_size")) {
      checkTensorDevice(obj, what);  // CUDA memory too, where the driver is usable
      if (py::hasattr(obj, "is_contiguous") && !obj.attr("is_contiguous")().cast<bool>()) {
        raiseInvalid(name + "the tensor is not contiguous");
      }
      keep_ = py::reinterpret_borrow<py::object>(obj);
      data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uint64_t>());
      size = obj.attr("numel")().cast<uint64_t>() * obj.attr("element_size")().cast<uint64_t>();
      return;
    }
    raiseInvalid(
        name +
        "expected a buffer (bytes, bytearray, memoryview, mmap, NumPy array) or a CPU or CUDA tensor, "
        "not " +
        Py_TYPE(o)->tp_name);
  }
  ~Payload() {
    if (view_) PyBuffer_Release(&*view_);
  }
  Payload(const Payload&) = delete;
  Payload& operator=(const Payload&) = delete;

  void* data = nullptr;
  uint64_t size = 0;

 private:
  std::optional<Py_buffer> view_;
  py::object keep_;
};

// The progress callable of a client and the first exception it raised during the current call
// (raised when that call returns; the transfer itself cannot be interrupted from the callback).
struct Progress {
  PyOwner callable;  // released with the GIL, from whichever thread drops the client
  std::optional<py::error_already_set> error;
};

// A client that close() releases while other threads may still be in a call on it: every call
// holds the C++ client through its own reference.
class Client {
 public:
  Client(std::shared_ptr<ObjectClient> client, std::shared_ptr<Progress> progress)
      : client_(std::move(client)), progress_(std::move(progress)) {}

  std::shared_ptr<ObjectClient> get() const {
    if (!client_) raiseStatus(Status(StatusCode::kClosed, "ObjectClient: the client is closed"));
    return client_;
  }

  // Runs call(client) without the GIL, then raises the progress callable's exception, if any, or
  // the call's error.
  template <typename Call>
  auto run(Call call) {
    std::shared_ptr<ObjectClient> c = get();
    if (progress_) progress_->error.reset();
    auto r = [&] {
      py::gil_scoped_release release;
      return call(*c);
    }();
    if (progress_ && progress_->error) {
      py::error_already_set e = std::move(*progress_->error);
      progress_->error.reset();
      throw e;
    }
    return r;
  }

  void close() {
    std::shared_ptr<ObjectClient> c = std::move(client_);
    py::gil_scoped_release release;
    c.reset();  // stops the client's RDMA session unless a call on another thread still holds it
  }

  bool closed() const { return !client_; }

 private:
  std::shared_ptr<ObjectClient> client_;
  std::shared_ptr<Progress> progress_;
};

py::dict infoDict(const ObjectInfo& info) {
  py::dict d;
  d["key"] = info.key;
  d["size"] = info.size;
  d["etag"] = info.etag;
  return d;
}

py::dict storeStatsDict(const objects::StoreStats& s) {
  py::dict d;
  d["objects"] = s.objects;
  d["bytes"] = s.bytes;
  d["buckets"] = s.buckets;
  d["rdma_gets"] = s.rdmaGets;
  d["rdma_puts"] = s.rdmaPuts;
  d["http_gets"] = s.httpGets;
  d["http_puts"] = s.httpPuts;
  d["rdma_bytes"] = s.rdmaBytes;
  d["http_bytes"] = s.httpBytes;
  d["refused"] = s.refused;
  d["memory_bytes"] = s.memoryBytes;
  d["cached_objects"] = s.cachedObjects;
  return d;
}

uint16_t toPort(int port, const char* what) {
  if (port < 0 || port > 65535) raiseInvalid(std::string("ObjectStore: ") + what + " must be 0..65535");
  return static_cast<uint16_t>(port);
}

// The object as a bytes object filled in place: its size first (HEAD), then the payload. An object
// replaced by a larger one in between is fetched again.
py::bytes getBytes(Client& client, const std::string& bucket, const std::string& key) {
  for (int attempt = 0;; ++attempt) {
    ObjectInfo info = unwrap(client.run([&](ObjectClient& c) { return c.head(bucket, key); }));
    auto out = py::reinterpret_steal<py::object>(
        PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(info.size)));
    if (!out) throw py::error_already_set();
    char* data = PyBytes_AS_STRING(out.ptr());
    Result<uint64_t> n = client.run([&](ObjectClient& c) { return c.get(bucket, key, data, info.size); });
    if (!n.isOk() && n.status().code() == StatusCode::kInvalidArgument && attempt < 3) {
      Result<ObjectInfo> now = client.run([&](ObjectClient& c) { return c.head(bucket, key); });
      if (now.isOk() && now->size > info.size) continue;
    }
    uint64_t got = unwrap(std::move(n));
    if (got < info.size) {
      PyObject* o = out.release().ptr();
      if (_PyBytes_Resize(&o, static_cast<Py_ssize_t>(got)) != 0) throw py::error_already_set();
      out = py::reinterpret_steal<py::object>(o);
    }
    return py::reinterpret_steal<py::bytes>(out.release());
  }
}

}  // namespace

void bindObjects(py::module_& m) {
  m.def(
      "parse_object_url",
      [](const std::string& url) {
        objects::ObjectUrl u = unwrap(objects::parseObjectUrl(url));
        return py::make_tuple(u.base, u.bucket, u.key);
      },
      py::arg("url"),
      "(base, bucket, key) of \"http://HOST:PORT[/BUCKET[/KEY]]\" (\"\" for a part that is absent); "
      "ferry.InvalidArgument for anything else.");

  py::class_<ObjectStore>(m, "ObjectStore", "The object store: S3-style HTTP, payloads by RDMA (store.h).")
      .def_static(
          "start",
          [](std::string host, int port, std::string rdmaHost, int rdmaPort, std::string dataDir,
             std::string accessKey, std::string secretKey, std::string region, int threads,
             uint64_t maxObjectBytes, uint64_t maxMemoryBytes) {
            StoreOptions o;
            o.host = std::move(host);
            o.port = toPort(port, "port");
            o.rdmaHost = std::move(rdmaHost);
            o.rdmaPort = toPort(rdmaPort, "rdma_port");
            o.dataDir = std::move(dataDir);
            o.accessKey = std::move(accessKey);
            o.secretKey = std::move(secretKey);
            o.region = std::move(region);
            o.threads = threads;
            o.maxObjectBytes = maxObjectBytes;
            o.maxMemoryBytes = maxMemoryBytes;
            auto store = [&] {
              py::gil_scoped_release release;
              return ObjectStore::start(std::move(o));
            }();
            return unwrap(std::move(store));
          },
          py::kw_only(), py::arg("host") = "127.0.0.1", py::arg("port") = 0, py::arg("rdma_host") = "",
          py::arg("rdma_port") = 0, py::arg("data_dir") = "", py::arg("access_key") = "",
          py::arg("secret_key") = "", py::arg("region") = "us-east-1", py::arg("threads") = 8,
          py::arg("max_object_bytes") = uint64_t{64} << 30, py::arg("max_memory_bytes") = 0,
          "Starts the HTTP listener and the object server (port 0: the kernel picks one). "
          "ferry.InvalidArgument for bad options, ferry.Unavailable when the address cannot be bound, "
          "ferry.IoError when the data directory cannot be read.")
      .def_property_readonly("port", &ObjectStore::port, "The HTTP port")
      .def_property_readonly("url", &ObjectStore::url, "\"http://HOST:PORT\", for ObjectClient.connect()")
      .def(
          "stats", [](const ObjectStore& s) { return storeStatsDict(s.stats()); },
          "objects, bytes, buckets, rdma_gets, rdma_puts, http_gets, http_puts, rdma_bytes, http_bytes, "
          "refused (requests answered with an error), memory_bytes (held in memory now), cached_objects "
          "(with a data directory: objects whose bytes are in memory too)")
      .def(
          "stop",
          [](ObjectStore& s) {
            py::gil_scoped_release release;
            s.stop();
          },
          "Stops serving (requests in flight finish first) and drops the objects held in memory. "
          "Idempotent.");

  py::class_<Client>(m, "ObjectClient", "A client of the object store (store.h).")
      .def_static(
          "connect",
          [](std::string url, std::string accessKey, std::string secretKey, std::string region, bool rdma,
             uint64_t pieceBytes, py::object progress, int timeout) {
            if (timeout <= 0) raiseInvalid("ObjectClient: the timeout must be a positive number of seconds");
            if (!progress.is_none() && !PyCallable_Check(progress.ptr())) {
              raiseInvalid("ObjectClient: progress must be a callable(done, total) or None");
            }
            ClientOptions o;
            o.accessKey = std::move(accessKey);
            o.secretKey = std::move(secretKey);
            o.region = std::move(region);
            o.rdma = rdma;
            o.pieceBytes = pieceBytes;
            o.timeoutSeconds = timeout;
            std::shared_ptr<Progress> state;
            if (!progress.is_none()) {
              state = std::make_shared<Progress>();
              state->callable.object = progress.release().ptr();
              std::weak_ptr<Progress> weak = state;
              o.progress = [weak](uint64_t done, uint64_t total) {
                std::shared_ptr<Progress> p = weak.lock();
                if (!p || !interpreterAlive()) return;
                py::gil_scoped_acquire gil;
                if (p->error) return;  // it failed once in this call: not again
                try {
                  py::handle(p->callable.object)(done, total);
                } catch (py::error_already_set& e) {
                  p->error = std::move(e);
                }
              };
            }
            auto c = [&] {
              py::gil_scoped_release release;
              return ObjectClient::connect(std::move(url), std::move(o));
            }();
            return Client(unwrap(std::move(c)), std::move(state));
          },
          py::arg("url"), py::kw_only(), py::arg("access_key") = "", py::arg("secret_key") = "",
          py::arg("region") = "us-east-1", py::arg("rdma") = true,
          py::arg("piece_bytes") = uint64_t{64} << 20, py::arg("progress") = py::none(),
          py::arg("timeout") = 120,
          "A client of the store at url (\"http://HOST:PORT\"; a path after it is ignored). "
          "ferry.InvalidArgument for a malformed URL or options, ferry.Unavailable when the RDMA session "
          "does not start (rdma=True).")
      .def_property_readonly("closed", &Client::closed, "Whether close() was called")
      .def("close", &Client::close, "Releases the client (its RDMA session). Idempotent.")
      .def(
          "create_bucket",
          [](Client& c, const std::string& bucket) {
            check(c.run([&](ObjectClient& o) { return o.createBucket(bucket); }));
          },
          py::arg("bucket"), "Creates a bucket (ferry.Busy when it exists).")
      .def(
          "delete_bucket",
          [](Client& c, const std::string& bucket) {
            check(c.run([&](ObjectClient& o) { return o.deleteBucket(bucket); }));
          },
          py::arg("bucket"), "Removes an empty bucket (ferry.Busy when it has objects).")
      .def(
          "buckets", [](Client& c) { return unwrap(c.run([](ObjectClient& o) { return o.buckets(); })); },
          "The names of the buckets")
      .def(
          "list",
          [](Client& c, const std::string& bucket, const std::string& prefix) {
            auto all = unwrap(c.run([&](ObjectClient& o) { return o.list(bucket, prefix); }));
            py::list out;
            for (const ObjectInfo& info : all) out.append(infoDict(info));
            return out;
          },
          py::arg("bucket"), py::arg("prefix") = "",
          "The bucket's objects whose key starts with prefix: dicts key, size, etag.")
      .def(
          "put",
          [](Client& c, const std::string& bucket, const std::string& key, py::handle data) {
            Payload p(data, false, "put");
            check(c.run([&](ObjectClient& o) { return o.put(bucket, key, p.data, p.size); }));
          },
          py::arg("bucket"), py::arg("key"), py::arg("data"),
          "Stores the buffer's bytes as the object (without copying them).")
      .def(
          "put_file",
          [](Client& c, const std::string& bucket, const std::string& key, const std::string& path) {
            check(c.run([&](ObjectClient& o) { return o.putFile(bucket, key, path); }));
          },
          py::arg("bucket"), py::arg("key"), py::arg("path"), "Stores the file at path as the object.")
      .def("get", &getBytes, py::arg("bucket"), py::arg("key"), "The object's bytes.")
      .def(
          "get_into",
          [](Client& c, const std::string& bucket, const std::string& key, py::handle buffer) {
            Payload p(buffer, true, "get_into");
            return unwrap(c.run([&](ObjectClient& o) { return o.get(bucket, key, p.data, p.size); }));
          },
          py::arg("bucket"), py::arg("key"), py::arg("buffer"),
          "Reads the object into the writable buffer; its size (ferry.InvalidArgument when it does not fit).")
      .def(
          "get_file",
          [](Client& c, const std::string& bucket, const std::string& key, const std::string& path) {
            check(c.run([&](ObjectClient& o) { return o.getFile(bucket, key, path); }));
          },
          py::arg("bucket"), py::arg("key"), py::arg("path"), "Writes the object to the file at path.")
      .def(
          "head",
          [](Client& c, const std::string& bucket, const std::string& key) {
            return infoDict(unwrap(c.run([&](ObjectClient& o) { return o.head(bucket, key); })));
          },
          py::arg("bucket"), py::arg("key"), "The object's key, size and etag.")
      .def(
          "remove",
          [](Client& c, const std::string& bucket, const std::string& key) {
            check(c.run([&](ObjectClient& o) { return o.remove(bucket, key); }));
          },
          py::arg("bucket"), py::arg("key"), "Removes the object (no error when there is none).");
}

}  // namespace ferry::python
