// A one-line progress bar on stderr for `ferry` commands (bench sizes, object transfers): drawn only
// when stderr is a terminal, erased by clear().
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

namespace ferry::cli {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void show(const std::string& label, double fraction) {
    if (!enabled_) return;
    fraction = std::clamp(fraction, 0.0, 1.0);
    int filled = static_cast<int>(fraction * 30);
    std::fprintf(stderr, "\r  %-18s [%.*s%.*s] %3d%%", label.c_str(), filled,
                 "##############################", 30 - filled, "..............................",
                 static_cast<int>(fraction * 100));
    std::fflush(stderr);
    shown_ = true;
  }
  void clear() {
    if (enabled_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

}  // namespace ferry::cli
