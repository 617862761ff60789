// The log threshold: setLevel() decides which lines are written, from the moment it returns, and
// the lines reach the forwarding descriptor (as they reach Python's logging) with their level.
#include "common/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace ferry::log {
namespace {

// Sends the log to a pipe for one test; restores stderr and the threshold afterwards.
class ForwardedLog {
 public:
  ForwardedLog() : before_(level()) {
    EXPECT_EQ(::pipe2(fds_, O_NONBLOCK | O_CLOEXEC), 0);
    setForwardFd(fds_[1]);
  }
  ~ForwardedLog() {
    setForwardFd(-1);
    setLevel(before_);
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  // Everything written since the last call (the pipe is read without waiting).
  std::string take() {
    std::string out;
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(fds_[0], buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
    return out;
  }

 private:
  int fds_[2] = {-1, -1};
  Level before_;
};

TEST(LogTest, SetLevelChangesWhichLinesAreWritten) {
  ForwardedLog log;
  setLevel(Level::kDebug);
  EXPECT_EQ(level(), Level::kDebug);
  EXPECT_TRUE(enabled(Level::kDebug));
  FERRY_LOG(kDebug, "detail %d", 1);
  FERRY_LOG(kInfo, "progress");
  EXPECT_EQ(log.take(), "DEBUG detail 1\nINFO progress\n");

  setLevel(Level::kWarn);
  EXPECT_EQ(level(), Level::kWarn);
  EXPECT_FALSE(enabled(Level::kDebug));
  EXPECT_FALSE(enabled(Level::kInfo));
  EXPECT_TRUE(enabled(Level::kWarn));
  FERRY_LOG(kDebug, "detail %d", 2);
  FERRY_LOG(kInfo, "progress");
  FERRY_LOG(kWarn, "trouble");
  EXPECT_EQ(log.take(), "WARN trouble\n");

  setLevel(Level::kError);
  FERRY_LOG(kWarn, "trouble");
  FERRY_LOG(kError, "failure");
  EXPECT_EQ(log.take(), "ERROR failure\n");
}

}  // namespace
}  // namespace ferry::log
