// ferry._core.agent.Store: the agent layer's discovery store (include/ferry/agent/store.h) for
// Python code that keeps keys of its own there, as ferry.nixl keeps NIXL metadata in etcd.
//
// Values are bytes; a missing key is None. The GIL is released during every call to the store.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/agent/store.h"
#include "status.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

using agent::Store;
using agent::StoreEvent;

std::chrono::milliseconds millis(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 86400) {
    raiseStatus(invalidArgument(std::string(what) + " must be between 0 and 86400 seconds"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

py::object bytesOrNone(Result<std::string> value) {
  if (!value.isOk() && value.status().code() == StatusCode::kNotFound) return py::none();
  return py::bytes(unwrap(std::move(value)));
}

// The value of key once it is there: at once when it is, else when a put of it arrives within
// timeout (a watch set before the first read, so that a put between the two is not missed).
Result<std::optional<std::string>> waitFor(Store& store, const std::string& key,
                                           std::chrono::milliseconds timeout) {
  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<std::string> value;
  };
  auto seen = std::make_shared<Seen>();
  FERRY_ASSIGN_OR_RETURN(auto watch, store.watch(key, [seen, key](const StoreEvent& e) {
    if (e.kind != StoreEvent::Kind::kPut || e.key != key) return;
    std::lock_guard<std::mutex> lock(seen->mu);
    seen->value = e.value;
    seen->cv.notify_all();
  }));
  Result<std::string> now = store.get(key);
  std::optional<std::string> out;
  if (now.isOk()) {
    out = std::move(now).value();
  } else if (now.status().code() != StatusCode::kNotFound) {
    store.unwatch(watch);
    return now.status();
  } else {
    std::unique_lock<std::mutex> lock(seen->mu);
    seen->cv.wait_for(lock, timeout, [&] { return seen->value.has_value(); });
    out = seen->value;
  }
  store.unwatch(watch);
  return out;
}

}  // namespace

void bindStore(py::module_& m) {
  py::class_<Store, std::shared_ptr<Store>>(
      m, "Store",
      "A discovery store by URL (memory://name, ferry://host:port, redis://host:port[/db], "
      "etcd://host:port): a key-value store of bytes. Every call has a deadline of `timeout` seconds; a "
      "store "
      "that is down raises ferry.Unavailable (or ferry.TimedOut) naming the URL, and a later call tries "
      "again.")
      .def(py::init([](const std::string& url, double timeout) {
             agent::StoreOptions options;
             options.timeout = millis(timeout, "timeout");
             return std::shared_ptr<Store>(unwrap(Store::open(url, options)));
           }),
           py::arg("url"), py::kw_only(), py::arg("timeout") = 3.0)
      .def_property_readonly("url", &Store::url, "The URL the store was opened with.")
      .def(
          "set",
          [](Store& s, const std::string& key, const py::bytes& value) {
            std::string v = value;
            py::gil_scoped_release release;
            check(s.set(key, v));
          },
          py::arg("key"), py::arg("value"), "Sets key (text, 1 to 1024 bytes) to value (bytes, up to 1 MiB).")
      .def(
          "get",
          [](Store& s, const std::string& key) {
            Result<std::string> value = [&] {
              py::gil_scoped_release release;
              return s.get(key);
            }();
            return bytesOrNone(std::move(value));
          },
          py::arg("key"), "The value of key, or None when there is none.")
      .def(
          "list",
          [](Store& s, const std::string& prefix) {
            Result<std::vector<agent::StoreEntry>> entries = [&] {
              py::gil_scoped_release release;
              return s.list(prefix);
            }();
            py::list out;
            for (auto& e : unwrap(std::move(entries))) out.append(py::make_tuple(e.key, py::bytes(e.value)));
            return out;
          },
          py::arg("prefix"), "Every (key, value) whose key starts with prefix.")
      .def(
          "erase",
          [](Store& s, const std::string& key) {
            py::gil_scoped_release release;
            check(s.erase(key));
          },
          py::arg("key"), "Deletes key; a key that is not there is not an error.")
      .def(
          "wait",
          [](Store& s, const std::string& key, double timeout) -> py::object {
            const auto limit = millis(timeout, "timeout");
            Result<std::optional<std::string>> value = [&] {
              py::gil_scoped_release release;
              return waitFor(s, key, limit);
            }();
            std::optional<std::string> got = unwrap(std::move(value));
            if (!got) return py::none();
            return py::bytes(*got);
          },
          py::arg("key"), py::arg("timeout"),
          "The value of key: at once when it is there, else the first one set within timeout seconds; None "
          "when "
          "none came.");
}

}  // namespace ferry::python
