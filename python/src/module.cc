// ferry._core: the extension module. Each layer's bindings live in their own file and add
// themselves to a submodule here.
#include <pybind11/pybind11.h>

#include "common/cuda_driver.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "ferry/common/version.h"
#include "status.h"

namespace py = pybind11;

namespace ferry::python {
void bindVerbs(py::module_& m);           // verbs_bindings.cc -> ferry._core.verbs
void bindVerbsConstants(py::module_& m);  // verbs_constants.cc -> ferry._core.verbs_constants
void bindEndpoint(py::module_& m);        // endpoint_bindings.cc -> ferry._core.endpoint
void bindAgent(py::module_& m);           // agent_bindings.cc -> ferry._core.agent
void bindStore(py::module_& m);           // store_bindings.cc -> ferry._core.agent.Store
void bindConnect(py::module_& m);         // connect_bindings.cc -> ferry._core.connect
void bindObjects(py::module_& m);         // objects_bindings.cc -> ferry._core.objects
}  // namespace ferry::python

namespace {

// Indexed by ferry::log::Level.
constexpr const char* kLogLevelNames[] = {"error", "warn", "info", "debug"};

ferry::log::Level logLevelNamed(const std::string& name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kLogLevelNames[i]) return static_cast<ferry::log::Level>(i);
  }
  throw py::value_error("log level: error, warn, info or debug, not '" + name + "'");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ferry's C++ core: verbs and endpoints";
  m.attr("__version__") = ferry::version();
  m.def(
      "config",
      [] {
        py::list out;
        for (const ferry::config::Setting& s : ferry::config::settings()) {
          py::dict d;
          d["name"] = s.variable->name;
          d["meaning"] = s.variable->meaning;
          d["default"] = s.variable->defaultText;
          d["valid"] = s.variable->validValues;
          d["set"] = s.set;
          d["value"] =
              ferry::config::isSecret(s.variable->name) && s.set ? s.effective : s.raw;  // never a secret
          d["effective"] = s.effective;
          d["error"] = s.error;
          out.append(d);
        }
        return out;
      },
      "Every FERRY_* variable: name, meaning, default, valid values, and this process's setting");
  m.def(
      "unknown_config",
      [] {
        py::list out;
        for (const ferry::config::UnknownVariable& u : ferry::config::unknownVariables()) {
          py::dict d;
          d["name"] = u.name;
          d["suggestion"] = u.suggestion;
          d["warning"] = u.warning();
          out.append(d);
        }
        return out;
      },
      "The FERRY_* variables set here that ferry does not read: name, suggestion, warning");
  m.def(
      "forward_log", [](int fd) { ferry::log::setForwardFd(fd); }, py::arg("fd"),
      "Sends ferry's log lines (\"LEVEL message\\n\") to fd instead of stderr; -1 returns to stderr");
  m.def(
      "log",
      [](const std::string& level, const std::string& message) {
        const ferry::log::Level l = logLevelNamed(level);
        if (ferry::log::enabled(l)) ferry::log::write(l, "%s", message.c_str());
      },
      py::arg("level"), py::arg("message"), "Writes one line through ferry's log (as the core does)");
  m.def(
      "set_log_level", [](const std::string& level) { ferry::log::setLevel(logLevelNamed(level)); },
      py::arg("level"), "Sets the threshold of ferry's log: 'error', 'warn', 'info' or 'debug'");
  m.def(
      "log_level", [] { return std::string(kLogLevelNames[static_cast<int>(ferry::log::level())]); },
      "The threshold of ferry's log: 'error', 'warn', 'info' or 'debug'");
  m.def("dropped_log_lines", &ferry::log::droppedLines, "Log lines the forwarding descriptor could not take");
  m.def(
      "agent_secret", [] { return py::bytes(ferry::config::agentSecret()); },
      "FERRY_AGENT_SECRET's value (b'' when unset), for Python layers that authenticate their own frames");
  m.def(
      "check_config", [] { ferry::python::check(ferry::config::check()); },
      "Raises ferry.InvalidArgument naming the first FERRY_* variable set to a value it does not take");
  // The driver as ferry found it (loaded at the first call, as a registration would load it): the
  // Python layers ask it whether CUDA memory can be registered here, and name its reason when not.
  m.def(
      "cuda",
      [] {
        const ferry::cuda::DriverInfo* found = nullptr;
        {
          py::gil_scoped_release release;  // the first call loads the driver (cuInit may take seconds)
          found = &ferry::cuda::driver();
        }
        const ferry::cuda::DriverInfo& driver = *found;
        py::dict d;
        d["usable"] = driver.usable;
        d["reason"] = driver.reason;
        d["library"] = driver.library;
        d["driver_version"] = driver.version;
        d["devices"] = driver.devices;
        return d;
      },
      "CUDA's driver as ferry loaded it, as `ferry info --json` shows it: usable (bool: CUDA memory "
      "registers and moves), reason (why not; '' when usable), library (what was loaded or tried), "
      "driver_version (1000 * major + 10 * minor; 0 when unknown), devices (the CUDA devices seen)");
  py::module_ verbs = m.def_submodule("verbs", "The verbs layer");
  ferry::python::bindVerbs(verbs);
  py::module_ verbsConstants = m.def_submodule(
      "verbs_constants", "The verbs constants (IBV_*), libibverbs' numbers as the C++ layer defines them");
  ferry::python::bindVerbsConstants(verbsConstants);
  py::module_ endpoint = m.def_submodule("endpoint", "The Endpoint API");
  ferry::python::bindEndpoint(endpoint);
  py::module_ agent = m.def_submodule("agent", "The agent: wireup, lanes, discovery, reconnection");
  ferry::python::bindAgent(agent);
  ferry::python::bindStore(agent);
  py::module_ connect = m.def_submodule("connect", "The connector: readable and writable operations");
  ferry::python::bindConnect(connect);
  py::module_ objects = m.def_submodule("objects", "The object store and its client");
  ferry::python::bindObjects(objects);
}
