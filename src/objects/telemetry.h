// Telemetry of the object server and client (spec 003, "Telemetry Management"): one line per event
// on a stream, filtered by the CUOBJ_LOG_PATH_* flags. setup()/setFlags() configure the sink of the
// objects created afterwards; the sink is created with the first object and released with the last.
// This build has no OpenTelemetry: a request for it falls back to the stream, as documented.
#pragma once

#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

namespace ferry::objects {

class Telemetry {
 public:
  static void setup(bool useOtel, std::ostream* os);
  static void shutdown();
  static void setFlags(unsigned flags);
  // The sink the next object uses: the live one, else a new one from the configuration.
  static std::shared_ptr<Telemetry> acquire();

  bool enabled(unsigned flag) const { return (flags_ & flag) != 0; }
  // "<UTC time> cuobj <LEVEL> pid=<pid> key=<key> <text>"; nothing when the flag is off.
  void log(unsigned flag, std::string_view key, std::string_view text);
  // A line for whoever holds no sink (setters, static calls): the configured stream, ERROR flag.
  static void logError(std::string_view key, std::string_view text);

  Telemetry(std::ostream* os, unsigned flags) : os_(os), flags_(flags) {}

 private:
  std::mutex mu_;
  std::ostream* os_;
  unsigned flags_;
};

}  // namespace ferry::objects
