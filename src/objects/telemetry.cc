#include "objects/telemetry.h"

#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "ferry/objects/cuobj_types.h"

namespace ferry::objects {
namespace {

struct Config {
  std::mutex mu;
  std::ostream* os = &std::cerr;
  unsigned flags = CUOBJ_LOG_PATH_ERROR;
  std::weak_ptr<Telemetry> live;
};

Config& config() {
  static Config* c = new Config();  // never destroyed: objects may outlive static destruction
  return *c;
}

const char* levelName(unsigned flag) {
  if (flag & CUOBJ_LOG_PATH_ERROR) return "ERROR";
  if (flag & CUOBJ_LOG_PATH_DEBUG) return "DEBUG";
  return "INFO";
}

std::string line(unsigned flag, std::string_view key, std::string_view text) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm utc{};
  gmtime_r(&tv.tv_sec, &utc);
  char stamp[48];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long>(tv.tv_usec));
  std::string out = std::string(stamp) + " cuobj " + levelName(flag) + " pid=" + std::to_string(getpid());
  if (!key.empty()) out += " key=" + std::string(key);
  out += " ";
  out += text;
  out += "\n";
  return out;
}

}  // namespace

void Telemetry::setup(bool /*useOtel: not built in, the stream is used*/, std::ostream* os) {
  Config& c = config();
  std::lock_guard<std::mutex> lock(c.mu);
  c.os = os ? os : &std::cerr;
}

void Telemetry::shutdown() {
  Config& c = config();
  std::lock_guard<std::mutex> lock(c.mu);
  c.os = &std::cerr;
  if (auto live = c.live.lock()) {
    std::lock_guard<std::mutex> l(live->mu_);
    live->os_ = &std::cerr;  // the caller is about to close the stream it gave
  }
}

void Telemetry::setFlags(unsigned flags) {
  Config& c = config();
  std::lock_guard<std::mutex> lock(c.mu);
  c.flags = flags;
}

std::shared_ptr<Telemetry> Telemetry::acquire() {
  Config& c = config();
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto live = c.live.lock()) return live;
  auto t = std::make_shared<Telemetry>(c.os, c.flags);
  c.live = t;
  return t;
}

void Telemetry::log(unsigned flag, std::string_view key, std::string_view text) {
  if (!enabled(flag)) return;
  std::string l = line(flag, key, text);
  std::lock_guard<std::mutex> lock(mu_);
  os_->write(l.data(), static_cast<std::streamsize>(l.size()));
  os_->flush();
}

void Telemetry::logError(std::string_view key, std::string_view text) {
  Config& c = config();
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto live = c.live.lock()) {
    live->log(CUOBJ_LOG_PATH_ERROR, key, text);
    return;
  }
  if (!(c.flags & CUOBJ_LOG_PATH_ERROR)) return;
  std::string l = line(CUOBJ_LOG_PATH_ERROR, key, text);
  c.os->write(l.data(), static_cast<std::streamsize>(l.size()));
  c.os->flush();
}

}  // namespace ferry::objects
