// The safe text encoding of a path, for ferry.path.IBPath.to_json / from_json.
//
// Decoding is ferry::verbs::Path::fromJson: strict (types, ranges, the version), so a path that
// came over a socket can be read without trusting its sender. Encoding goes through the same
// decoder first, so a path that does not make sense is refused before it is sent.
#include <string>

#include "ferry/verbs/path.h"
#include "status.h"
#include "verbs_objects.h"

namespace ferry::python {

namespace {

py::dict pathToDict(const verbs::Path& p) {
  py::dict d;
  d["sgid"] = gidBytes(p.sgid);
  d["dgid"] = gidBytes(p.dgid);
  d["sgid_index"] = p.sgidIndex;
  d["slid"] = p.slid;
  d["dlid"] = p.dlid;
  d["sqpn"] = p.sqpn;
  d["dqpn"] = p.dqpn;
  d["sqpsn"] = p.sqpsn;
  d["dqpsn"] = p.dqpsn;
  d["qkey"] = p.qkey;
  d["pkey_index"] = p.pkeyIndex;
  d["mtu"] = static_cast<int>(p.mtu);
  d["retries"] = p.retries;
  d["rnr_retries"] = p.rnrRetries;
  d["min_rnr_timer"] = p.minRnrTimer;
  d["packet_life_time"] = p.packetLifeTime;
  d["srdatomic"] = p.srdatomic;
  d["drdatomic"] = p.drdatomic;
  d["port_num"] = p.portNum;
  d["sl"] = p.sl;
  d["has_grh"] = p.hasGrh;
  d["hop_limit"] = p.hopLimit;
  d["traffic_class"] = p.trafficClass;
  d["flow_label"] = p.flowLabel;
  d["rate"] = p.rate;
  return d;
}

}  // namespace

void bindVerbsPath(py::module_& m) {
  m.def(
      "path_from_json",
      [](const std::string& text) {
        Result<verbs::Path> path = verbs::Path::fromJson(text);
        if (!path.isOk()) raiseStatus(path.status());
        return pathToDict(*path);
      },
      py::arg("text"),
      "Decodes a path (ferry::verbs::Path::fromJson, strict) into a dict of its fields; GIDs as 16 bytes. "
      "Raises ferry.InvalidArgument for anything malformed.");
  m.def(
      "path_normalize_json",
      [](const std::string& text) {
        Result<verbs::Path> path = verbs::Path::fromJson(text);
        if (!path.isOk()) raiseStatus(path.status());
        return path->toJson();
      },
      py::arg("text"),
      "Checks a path's JSON with the strict decoder and returns its canonical encoding (Path::toJson).");
}

}  // namespace ferry::python
