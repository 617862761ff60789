// ferry._core.connect: the connector (readable / writable operations) for Python.
// python/ferry/connect.py shapes it with spec 004's names (Connector, Descriptor, RdmaMetadata...).
//
// Descriptors arrive as (target, length, keepalive) tuples: target is a buffer object, a CPU
// tensor, or an address (int, with its length); keepalive is held while the operation may touch
// the memory. The GIL is released for every call that may wait (registration, cancel, shutdown).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ferry/connect/connector.h"
#include "memory_args.h"
#include "status.h"

namespace ferry::python {
namespace {

using connect::Buffer;
using connect::Connector;
using connect::ConnectorOptions;
using connect::Operation;

std::vector<Buffer> toBuffers(py::handle descriptors) {
  if (!PySequence_Check(descriptors.ptr()))
    raiseInvalid("descriptors: expected a list of (target, length, keepalive)");
  py::list items(py::reinterpret_borrow<py::object>(descriptors));
  std::vector<Buffer> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    py::handle item = items[i];
    if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 3) {
      raiseInvalid("descriptor " + std::to_string(i) + ": expected (target, length, keepalive)");
    }
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    Memory m = toMemory(t[0], 0, t[1]);
    auto owner = std::make_shared<PyOwner>();
    PyObject* keep = t[2].ptr();
    Py_INCREF(keep);
    owner->object = keep;
    // The buffer's own export (a view held while registered) and the descriptor, together.
    std::shared_ptr<void> both = m.options.owner;
    Buffer b{.addr = m.addr, .length = m.length, .readOnly = !m.options.writable, .owner = nullptr};
    b.owner = std::shared_ptr<void>(
        new std::pair<std::shared_ptr<void>, std::shared_ptr<PyOwner>>(both, owner),
        [](void* p) { delete static_cast<std::pair<std::shared_ptr<void>, std::shared_ptr<PyOwner>>*>(p); });
    out.push_back(std::move(b));
  }
  return out;
}

// Converts the descriptors (with the GIL), then runs call (without it) and returns its operation.
template <typename Call>
std::shared_ptr<Operation> withBuffers(py::handle descriptors, Call call) {
  auto bufs = toBuffers(descriptors);
  auto r = [&] {
    py::gil_scoped_release release;
    return call(std::move(bufs));
  }();
  return unwrap(std::move(r));
}

std::chrono::milliseconds toMs(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 1e9) raiseInvalid(std::string(what) + ": expected seconds in [0, 1e9]");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

py::dict connectorStatsDict(const connect::ConnectorStats& s) {
  py::dict d;
  d["created"] = s.created;
  d["begun"] = s.begun;
  d["served"] = s.served;
  d["refused"] = s.refused;
  d["completed"] = s.completed;
  d["cancelled"] = s.cancelled;
  d["errored"] = s.errored;
  d["bytes_moved"] = s.bytesMoved;
  d["live"] = s.live;
  return d;
}

}  // namespace

void bindConnect(py::module_& m) {
  m.def(
      "buffer_info",
      [](py::handle obj) {
        Py_buffer view;
        bool readOnly = false;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) != 0) {
          PyErr_Clear();
          readOnly = true;
          if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) {
            PyErr_Clear();
            raiseInvalid(std::string("Descriptor: a ") + Py_TYPE(obj.ptr())->tp_name +
                         " that is not a contiguous buffer");
          }
        }
        auto out =
            py::make_tuple(reinterpret_cast<uint64_t>(view.buf), static_cast<uint64_t>(view.len), readOnly);
        PyBuffer_Release(&view);
        return out;
      },
      py::arg("obj"), "(address, size, read_only) of a contiguous buffer object.");
  py::class_<Operation, std::shared_ptr<Operation>>(m, "Operation",
                                                    "One readable, writable, read or write operation.")
      .def_property_readonly("id", &Operation::id)
      .def_property_readonly("kind", [](const Operation& o) { return static_cast<int>(o.kind()); })
      .def_property_readonly("passive", &Operation::passive)
      .def_property_readonly("status", [](const Operation& o) { return static_cast<int>(o.status()); })
      .def_property_readonly("bytes", &Operation::bytes)
      .def("completion", &Operation::completion, "A future done when the operation ended (awaitable).")
      .def(
          "raise_error",
          [](const Operation& o) {
            Status st = o.error();
            if (!st.isOk() && st.code() != StatusCode::kBusy) raiseStatus(st);
          },
          "Raises the ferry error that ended the operation (nothing when it completed or runs).")
      .def("metadata", [](const Operation& o) { return unwrap(o.metadata()); })
      .def(
          "cancel",
          [](Operation& o) {
            py::gil_scoped_release release;
            o.cancel();
          },
          "Cancels the operation unless it ended (see connector.h).");

  py::class_<Connector, std::shared_ptr<Connector>>(m, "Connector", "ferry's connector (on its own agent).")
      .def(py::init([](std::string workerId, std::string store, std::string scope, std::string secret,
                       std::string listenHost, double metadataTtl, double connectTimeout, double cancelGrace,
                       uint64_t chunkBytes, uint32_t window) {
             ConnectorOptions o;
             o.workerId = std::move(workerId);
             o.store = std::move(store);
             o.scope = std::move(scope);
             o.secret = std::move(secret);
             o.listenHost = std::move(listenHost);
             o.metadataTtl = toMs(metadataTtl, "metadata_ttl");
             if (o.metadataTtl.count() == 0) raiseInvalid("metadata_ttl: must be positive");
             o.connectTimeout = toMs(connectTimeout, "connect_timeout");
             o.cancelGrace = toMs(cancelGrace, "cancel_grace");
             o.chunkBytes = chunkBytes;
             o.window = window;
             auto c = [&] {
               py::gil_scoped_release release;
               return Connector::start(std::move(o));
             }();
             return unwrap(std::move(c));
           }),
           py::arg("worker_id") = "", py::arg("store") = "", py::arg("scope") = "default",
           py::arg("secret") = "", py::arg("listen_host") = "", py::arg("metadata_ttl") = 600.0,
           py::arg("connect_timeout") = 30.0, py::arg("cancel_grace") = 2.0,
           py::arg("chunk_bytes") = uint64_t{64} << 20, py::arg("window") = 4)
      .def_property_readonly("name", &Connector::name)
      .def_property_readonly("namespace", &Connector::nameSpace)
      .def_property_readonly("address", [](const Connector& c) { return py::bytes(c.agent()->address()); })
      .def("stats", [](const Connector& c) { return connectorStatsDict(c.stats()); })
      .def(
          "create_readable",
          [](Connector& c, py::handle descriptors) {
            return withBuffers(descriptors,
                               [&](std::vector<Buffer> b) { return c.createReadable(std::move(b)); });
          },
          py::arg("descriptors"))
      .def(
          "create_writable",
          [](Connector& c, py::handle descriptors) {
            return withBuffers(descriptors,
                               [&](std::vector<Buffer> b) { return c.createWritable(std::move(b)); });
          },
          py::arg("descriptors"))
      .def(
          "begin_read",
          [](Connector& c, std::string metadata, py::handle descriptors) {
            return withBuffers(descriptors,
                               [&](std::vector<Buffer> b) { return c.beginRead(metadata, std::move(b)); });
          },
          py::arg("metadata"), py::arg("descriptors"))
      .def(
          "begin_write",
          [](Connector& c, py::handle descriptors, std::string metadata) {
            return withBuffers(descriptors,
                               [&](std::vector<Buffer> b) { return c.beginWrite(std::move(b), metadata); });
          },
          py::arg("descriptors"), py::arg("metadata"))
      .def("shutdown", [](Connector& c) {
        py::gil_scoped_release release;
        c.shutdown();
      });
}

}  // namespace ferry::python
