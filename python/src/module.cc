// ferry._core: the extension module. Each layer's bindings live in their own file and add
// themselves to a submodule here.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace ferry::python {
void bindVerbs(py::module_& m);     // verbs_bindings.cc -> ferry._core.verbs
void bindEndpoint(py::module_& m);  // endpoint_bindings.cc -> ferry._core.endpoint
void bindAgent(py::module_& m);     // agent_bindings.cc -> ferry._core.agent
void bindConnect(py::module_& m);   // connect_bindings.cc -> ferry._core.connect
}  // namespace ferry::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "ferry's C++ core: verbs and endpoints";
  m.attr("__version__") = FERRY_VERSION;
  py::module_ verbs = m.def_submodule("verbs", "The verbs layer");
  ferry::python::bindVerbs(verbs);
  py::module_ endpoint = m.def_submodule("endpoint", "The Endpoint API");
  ferry::python::bindEndpoint(endpoint);
  py::module_ agent = m.def_submodule("agent", "The agent: wireup, lanes, discovery, reconnection");
  ferry::python::bindAgent(agent);
  py::module_ connect = m.def_submodule("connect", "The connector: readable and writable operations");
  ferry::python::bindConnect(connect);
}
