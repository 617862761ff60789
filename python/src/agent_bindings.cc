// ferry._core.agent: the agent (wireup, lanes, discovery, reconnection) for Python.
// python/ferry/agent/__init__.py shapes it as PeerAgent / start_peer_agent.
//
// Batches: a ferry.Assignment (named fields), a (region, local_offset, remote_offset, length)
// 4-tuple (one region name on both sides), a (local_region, remote_region, local_offset,
// remote_offset, length) 5-tuple of two names, or the Endpoint API's raw 5-tuple of integer keys
// (mr_key, remote_mr_key, target_offset, source_offset, length), offsets named by direction as that
// document has them. Chunks: (region, offset, length), one or a list.
//
// The GIL is released while posting and while waiting.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "ferry/agent/agent.h"
#include "memory_args.h"
#include "status.h"

namespace ferry::python {
namespace {

using agent::Agent;
using agent::AgentOptions;
using agent::NamedAssignment;
using agent::NamedChunk;
using agent::PeerConnection;
using agent::RegionRef;
using endpoint::OpKind;

RegionRef toRegion(PyObject* o, const char* what, size_t index) {
  if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(o, &size);
    if (text == nullptr) {
      PyErr_Clear();
      raiseInvalid(std::string(what) + " of item " + std::to_string(index) + " is not valid text");
    }
    return std::string(text, static_cast<size_t>(size));
  }
  return static_cast<endpoint::MrHandle>(toU64(o, what, index));
}

bool isTuple(PyObject* o) { return PyTuple_Check(o); }

std::vector<NamedAssignment> toAssignments(py::handle batch, OpKind kind) {
  std::vector<NamedAssignment> out;
  py::list items;
  if (isTuple(batch.ptr()) || py::hasattr(batch, "local_offset")) {
    items.append(batch);
  } else if (PySequence_Check(batch.ptr())) {
    items = py::list(py::reinterpret_borrow<py::object>(batch));
  } else {
    raiseInvalid("assignments: expected a tuple, a ferry.Assignment or a list of them");
  }
  if (items.empty()) raiseInvalid("assignments: the batch is empty");
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* item = items[i].ptr();
    if (isTuple(item)) {
      Py_ssize_t n = PyTuple_GET_SIZE(item);
      PyObject** f = &PyTuple_GET_ITEM(item, 0);
      if (n == 4) {
        RegionRef r = toRegion(f[0], "region", i);
        out.push_back({.local = r,
                       .remote = r,
                       .localOffset = toU64(f[1], "local_offset", i),
                       .remoteOffset = toU64(f[2], "remote_offset", i),
                       .length = toU64(f[3], "length", i)});
        continue;
      }
      if (n == 5) {
        bool named = PyUnicode_Check(f[0]) || PyUnicode_Check(f[1]);
        RegionRef local = toRegion(f[0], named ? "local_region" : "mr_key", i);
        RegionRef remote = toRegion(f[1], named ? "remote_region" : "remote_mr_key", i);
        uint64_t a = toU64(f[2], named ? "local_offset" : "target_offset", i);
        uint64_t b = toU64(f[3], named ? "remote_offset" : "source_offset", i);
        uint64_t len = toU64(f[4], "length", i);
        if (named) {
          out.push_back(
              {.local = local, .remote = remote, .localOffset = a, .remoteOffset = b, .length = len});
        } else {
          // The Endpoint API's tuple: target is where the bytes land (local for a read).
          bool read = kind == OpKind::kRead;
          out.push_back({.local = local,
                         .remote = remote,
                         .localOffset = read ? a : b,
                         .remoteOffset = read ? b : a,
                         .length = len});
        }
        continue;
      }
      raiseInvalid("assignment " + std::to_string(i) + " has " + std::to_string(n) +
                   " fields: expected (region, local_offset, remote_offset, length) or (local_region, "
                   "remote_region, local_offset, remote_offset, length)");
    }
    py::handle h(item);
    if (!py::hasattr(h, "local") || !py::hasattr(h, "remote") || !py::hasattr(h, "length")) {
      raiseInvalid("assignment " + std::to_string(i) + " is neither a tuple nor a ferry.Assignment");
    }
    py::object l = h.attr("local"), r = h.attr("remote");
    py::object lo = h.attr("local_offset"), ro = h.attr("remote_offset"), len = h.attr("length");
    out.push_back({.local = toRegion(l.ptr(), "local", i),
                   .remote = toRegion(r.ptr(), "remote", i),
                   .localOffset = toU64(lo.ptr(), "local_offset", i),
                   .remoteOffset = toU64(ro.ptr(), "remote_offset", i),
                   .length = toU64(len.ptr(), "length", i)});
  }
  return out;
}

std::vector<NamedChunk> toNamedChunks(py::handle chunks) {
  std::vector<NamedChunk> out;
  py::list items;
  if (isTuple(chunks.ptr())) {
    items.append(chunks);
  } else if (PySequence_Check(chunks.ptr())) {
    items = py::list(py::reinterpret_borrow<py::object>(chunks));
  } else {
    raiseInvalid("chunks: expected a (region, offset, length) tuple or a list of them");
  }
  if (items.empty()) raiseInvalid("chunks: none given");
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* item = items[i].ptr();
    if (!isTuple(item) || PyTuple_GET_SIZE(item) != 3) {
      raiseInvalid("chunk " + std::to_string(i) + " is not a (region, offset, length) tuple");
    }
    PyObject** f = &PyTuple_GET_ITEM(item, 0);
    out.push_back({.region = toRegion(f[0], "region", i),
                   .offset = toU64(f[1], "offset", i),
                   .length = toU64(f[2], "length", i)});
  }
  return out;
}

std::chrono::milliseconds toMillis(double seconds, const char* what) {
  if (!(seconds > 0) || seconds > 1e7)
    raiseInvalid(std::string(what) + " must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

std::shared_ptr<Agent> startAgent(const std::string& alias, const std::string& store,
                                  const std::string& scope, const std::vector<std::string>& devices,
                                  const std::string& listenHost, int listenPort, double connectTimeout,
                                  double peerTimeout, double heartbeat, int leaseTtl,
                                  const std::string& secret, const std::string& lanes,
                                  std::optional<uint32_t> recvDepth, std::optional<uint32_t> recvBufferSize) {
  AgentOptions o;
  o.alias = alias;
  o.store = store;
  o.scope = scope;
  o.devices = devices;
  o.listenHost = listenHost;
  if (listenPort < 0 || listenPort > 65535) raiseInvalid("listen_port must be 0 .. 65535");
  o.listenPort = static_cast<uint16_t>(listenPort);
  o.connectTimeout = toMillis(connectTimeout, "connect_timeout");
  o.peerTimeout = toMillis(peerTimeout, "peer_timeout");
  o.heartbeat = heartbeat == 0 ? std::chrono::milliseconds(0) : toMillis(heartbeat, "heartbeat");
  if (leaseTtl < 1) raiseInvalid("lease_ttl must be at least 1 second");
  o.leaseTtl = std::chrono::seconds(leaseTtl);
  o.secret = secret;
  if (!lanes.empty()) o.lanes = unwrap(agent::parseLaneOverrides(lanes));
  if (recvDepth) o.recvDepth = *recvDepth;
  if (recvBufferSize) o.recvBufferSize = *recvBufferSize;
  Result<std::shared_ptr<Agent>> a = Status(StatusCode::kInternal, "unset");
  {
    py::gil_scoped_release release;
    a = Agent::start(std::move(o));
  }
  return unwrap(std::move(a));
}

// Runs fn without the GIL and returns what it returned (errors are raised afterwards, with it).
template <typename Fn>
auto released(Fn&& fn) {
  py::gil_scoped_release release;
  return fn();
}

py::dict lanesDict(const agent::LaneSet& set) {
  py::dict d;
  for (int i = 0; i < agent::kNumOpClasses; ++i) {
    d[agent::opClassName(static_cast<agent::OpClass>(i))] = set.lanes[i].label();
  }
  return d;
}

py::dict lanesDetail(const agent::LaneSet& set) {
  py::dict d;
  for (int i = 0; i < agent::kNumOpClasses; ++i) {
    const agent::Lane& l = set.lanes[i];
    py::dict e;
    e["lane"] = l.label();
    e["local_device"] = l.localDevice;
    e["remote_device"] = l.remoteDevice;
    e["why"] = l.why;
    d[agent::opClassName(static_cast<agent::OpClass>(i))] = e;
  }
  return d;
}

template <typename F, typename Fn>
F post(Fn&& fn) {
  Result<F> f = Status(StatusCode::kInternal, "unset");
  {
    py::gil_scoped_release release;
    f = fn();
  }
  return unwrap(std::move(f));
}

}  // namespace

void bindAgent(py::module_& m) {
  py::class_<PeerConnection, std::shared_ptr<PeerConnection>>(m, "PeerConnection",
                                                              "The connection to one peer: usable at once.")
      .def_property_readonly("peer_alias", &PeerConnection::peerAlias,
                             "The peer's alias (its address's alias when connected by address).")
      .def_property_readonly("peer_uuid", &PeerConnection::peerUuid,
                             "The peer's uuid as hex ('' before its address is known).")
      .def("is_connected", &PeerConnection::isConnected, "Whether the wireup finished and the peer is there.")
      .def("ready", &PeerConnection::ready,
           "The wireup as a future (wait() it, or await it): done when connected or failed.")
      .def(
          "wait",
          [](const PeerConnection& c, py::object timeout) {
            waitFuture(c.ready(), timeout);
            return true;
          },
          py::arg("timeout") = py::none(),
          "Waits for the wireup (seconds; None: until its deadline). Returns True; raises its error "
          "(ferry.TimedOut, ferry.PeerGone, ferry.Unavailable, ...).")
      .def_property_readonly(
          "endpoint", [](const PeerConnection& c) { return c.endpoint(agent::OpClass::kRma); },
          "The Endpoint of the remote-memory-access lane (None before the wireup finished).")
      .def(
          "endpoint_of",
          [](const PeerConnection& c, const std::string& cls) {
            if (cls == "messages") return c.endpoint(agent::OpClass::kMessages);
            if (cls == "rma") return c.endpoint(agent::OpClass::kRma);
            if (cls == "atomics") return c.endpoint(agent::OpClass::kAtomics);
            raiseInvalid("operation class must be 'messages', 'rma' or 'atomics'");
          },
          py::arg("op_class"),
          "The Endpoint of an operation class's lane: op_class is 'messages', 'rma' or 'atomics' (None "
          "before the wireup finished). Raises ferry.InvalidArgument for another class.")
      .def(
          "lanes", [](const PeerConnection& c) { return lanesDict(unwrap(c.lanes())); },
          "The lane of each operation class: {'messages', 'rma', 'atomics'} to 'same_host', 'tcp' or "
          "'rdma:<local device>'. Raises ferry.Unavailable before the peer's address is known.")
      .def(
          "lanes_detail", [](const PeerConnection& c) { return lanesDetail(unwrap(c.lanes())); },
          "The lanes with their devices: per operation class, {'lane', 'local_device', 'remote_device', "
          "'why'} (why: the reason it was chosen). Raises ferry.Unavailable before the peer's address is "
          "known.")
      .def(
          "write",
          [](PeerConnection& c, py::object batch) {
            auto list = toAssignments(batch, OpKind::kWrite);
            return post<endpoint::ReadWriteFuture>([&] { return c.write(list); });
          },
          py::arg("assignments"),
          "WRITEs a batch to the peer; a ReadWriteFuture, done when every byte is placed at the peer. "
          "assignments is one assignment or a list of them: (region, local_offset, remote_offset, length), "
          "(local_region, remote_region, local_offset, remote_offset, length), the Endpoint API's raw tuple "
          "or a ferry.Assignment; regions by name, offsets and lengths in bytes. Allowed before the wireup "
          "finished (queued, then posted in order). Bad local input (an unknown local region, a range "
          "outside it, an empty batch) raises at once; a remote region the peer does not have fails the "
          "future with ferry.NotFound.")
      .def(
          "read",
          [](PeerConnection& c, py::object batch) {
            auto list = toAssignments(batch, OpKind::kRead);
            return post<endpoint::ReadWriteFuture>([&] { return c.read(list); });
          },
          py::arg("assignments"),
          "READs a batch from the peer; a ReadWriteFuture, done when every byte is in local memory. "
          "assignments is one assignment or a list of them: (region, local_offset, remote_offset, length), "
          "(local_region, remote_region, local_offset, remote_offset, length), the Endpoint API's raw tuple "
          "or a ferry.Assignment; regions by name, offsets and lengths in bytes. Allowed before the wireup "
          "finished (queued, then posted in order). Bad local input (an unknown local region, a range "
          "outside it, an empty batch) raises at once; a remote region the peer does not have fails the "
          "future with ferry.NotFound.")
      .def(
          "write_with_imm",
          [](PeerConnection& c, py::object batch, py::object imm) {
            auto list = toAssignments(batch, OpKind::kWriteWithImm);
            uint32_t v = toImm(imm);
            return post<endpoint::ReadWriteFuture>([&] { return c.writeWithImm(list, v); });
          },
          py::arg("assignments"), py::arg("imm_data") = 0,
          "write() followed by the immediate imm_data (-2^31 .. 2^32-1, delivered as unsigned 32-bit), which"
          " the peer's imm_recv() gets once every byte of the batch is in place there. Returns a "
          "ReadWriteFuture.")
      .def(
          "send",
          [](PeerConnection& c, py::object chunks) {
            auto list = toNamedChunks(chunks);
            return post<endpoint::SendFuture>([&] { return c.send(list); });
          },
          py::arg("chunks"),
          "Sends one message gathered in order from the chunks; a SendFuture, done when the message is in "
          "the peer's receive buffers. Sends and receives match by order. chunks is (region, offset, length)"
          " or a list of them: regions by name, offsets and lengths in bytes.")
      .def(
          "recv",
          [](PeerConnection& c, py::object chunks) {
            auto list = toNamedChunks(chunks);
            return post<endpoint::RecvFuture>([&] { return c.recv(list); });
          },
          py::arg("chunks"),
          "Receives the peer's next message, scattered in order over the chunks; a RecvFuture whose nbytes()"
          " is the message's length (a longer message fails it with ferry.InvalidArgument). chunks is "
          "(region, offset, length) or a list of them: regions by name, offsets and lengths in bytes.")
      .def(
          "imm_recv",
          [](PeerConnection& c) { return post<endpoint::ImmRecvFuture>([&] { return c.immRecv(); }); },
          "The peer's next write_with_imm immediate, in the order the peer issued them: an ImmRecvFuture, "
          "done when all that write's data is in place here; imm_data() is the value.")
      .def("__repr__", [](const PeerConnection& c) {
        return "<ferry PeerConnection to '" + c.peerAlias() + "' " +
               (c.isConnected() ? "connected" : "not connected") + ">";
      });

  py::class_<Agent, std::shared_ptr<Agent>>(m, "Agent", "An agent (see ferry.PeerAgent).")
      .def(py::init(&startAgent), py::kw_only(), py::arg("alias") = "", py::arg("store") = "",
           py::arg("scope") = "default", py::arg("devices") = std::vector<std::string>{},
           py::arg("listen_host") = "", py::arg("listen_port") = 0, py::arg("connect_timeout") = 30.0,
           py::arg("peer_timeout") = 5.0, py::arg("heartbeat") = 0.0, py::arg("lease_ttl") = 10,
           py::arg("secret") = "", py::arg("lanes") = "", py::arg("recv_depth") = py::none(),
           py::arg("recv_buffer_size") = py::none())
      .def_property_readonly("alias", &Agent::alias)
      .def_property_readonly("address", [](const Agent& a) { return py::bytes(a.address()); })
      .def_property_readonly("uuid", [](const Agent& a) { return agent::uuidText(a.workerAddress().uuid); })
      .def("describe", [](const Agent& a) { return a.workerAddress().describe(); })
      .def(
          "connect_to",
          [](Agent& a, const std::string& alias, size_t qpNum) {
            return unwrap(released([&] { return a.connect(alias, qpNum); }));
          },
          py::arg("alias"), py::arg("qp_num") = 1)
      .def(
          "connect_address",
          [](Agent& a, py::bytes address, size_t qpNum) {
            std::string bytes = address;
            return unwrap(released([&] { return a.connectAddress(bytes, qpNum); }));
          },
          py::arg("address"), py::arg("qp_num") = 1)
      .def(
          "peer",
          [](Agent& a, const std::string& alias) { return unwrap(released([&] { return a.peer(alias); })); },
          py::arg("alias"))
      .def(
          "register_memory_region",
          [](Agent& a, const std::string& name, py::object target, uint64_t offset, py::object length) {
            Memory mem = toMemory(target, offset, length);
            Status st;
            {
              py::gil_scoped_release release;
              st = a.registerMemoryRegion(name, mem.addr, mem.length, std::move(mem.options));
            }
            check(st);
          },
          py::arg("name"), py::arg("ptr"), py::arg("offset") = 0, py::arg("length") = py::none())
      .def(
          "unregister_memory_region",
          [](Agent& a, const std::string& name) {
            check(released([&] { return a.unregisterMemoryRegion(name); }));
          },
          py::arg("name"))
      .def(
          "get_mr_info",
          [](Agent& a, const std::string& peer, const std::string& name) {
            Result<std::string> info = Status(StatusCode::kInternal, "unset");
            {
              py::gil_scoped_release release;
              info = a.getMrInfo(peer, name);
            }
            return unwrap(std::move(info));
          },
          py::arg("peer"), py::arg("name"))
      .def("list_agents", [](Agent& a) { return unwrap(released([&] { return a.listAgents(); })); })
      .def(
          "lanes", [](Agent& a, const std::string& peer) { return lanesDict(unwrap(a.lanes(peer))); },
          py::arg("peer"))
      .def(
          "lanes_detail",
          [](Agent& a, const std::string& peer) { return lanesDetail(unwrap(a.lanes(peer))); },
          py::arg("peer"))
      .def("peers", &Agent::peers)
      .def("stats",
           [](const Agent& a) {
             agent::AgentStats s = a.stats();
             py::dict d;
             d["requests_sent"] = s.requestsSent;
             d["replies_sent"] = s.repliesSent;
             d["acks_sent"] = s.acksSent;
             d["retries"] = s.retries;
             d["duplicates_dropped"] = s.duplicatesDropped;
             d["peers_gone"] = s.peersGone;
             d["operations_queued"] = s.operationsQueued;
             d["messages_refused"] = s.messagesRefused;
             d["connections_refused"] = s.connectionsRefused;
             d["challenges_sent"] = s.challengesSent;
             return d;
           })
      .def("shutdown", &Agent::shutdown, py::call_guard<py::gil_scoped_release>());
}

}  // namespace ferry::python
