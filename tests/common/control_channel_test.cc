// ControlChannel (common/control_channel.h): its input cut into lines by net::LineFramer, however the
// bytes arrive, within the protocol's bound on a line, and every line (an empty one too) checked.
#include "common/control_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace ferry {
namespace {

using namespace std::chrono_literals;

// A channel over one end of a socket pair; `peer` is the other end, written by the test.
struct ChannelPair {
  ControlChannel channel;
  int peer = -1;

  explicit ChannelPair(size_t maxLine) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    channel = ControlChannel(fds[0], {.tag = "ferry_test", .version = 1, .maxLine = maxLine});
    peer = fds[1];
  }
  ~ChannelPair() {
    if (peer >= 0) ::close(peer);
  }
  void write(const std::string& bytes) {
    ASSERT_EQ(::send(peer, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
};

TEST(ControlChannel, AMessageCutAcrossSeveralReadsArrivesWholeAndTheNextOneAfterIt) {
  ChannelPair p(4096);
  const std::string first = R"({"ferry_test": 1, "type": "hello", "size": 4096})";
  // Written in pieces, each after the channel has had time to read the one before, so no read
  // sees the whole line; the second message comes in the same write as the first's end.
  std::thread writer([&] {
    p.write(first.substr(0, 7));
    std::this_thread::sleep_for(20ms);
    p.write(first.substr(7, 20));
    std::this_thread::sleep_for(20ms);
    p.write(first.substr(27) + "\r\n" + R"({"ferry_test": 1, "type": "bye"})" + "\n");
  });
  auto hello = p.channel.expect("hello", 5);
  writer.join();
  ASSERT_TRUE(hello.isOk()) << hello.status().toString();
  EXPECT_EQ(*controlFields(*hello).integer("size", 0, 1 << 20), 4096);
  EXPECT_TRUE(p.channel.readable(0));  // the second message is buffered already
  auto bye = p.channel.expect("bye", 5);
  ASSERT_TRUE(bye.isOk()) << bye.status().toString();
  EXPECT_FALSE(p.channel.readable(0));
}

TEST(ControlChannel, ALineLongerThanTheBoundIsAProtocolErrorWithoutWaitingForItsEnd) {
  ChannelPair p(64);
  p.write(R"({"ferry_test": 1, "type": "ok"})"
          "\n");
  p.write(std::string(65, 'x'));  // no newline: the line is not over, but already too long
  auto ok = p.channel.expect("ok", 5);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  const auto started = std::chrono::steady_clock::now();
  auto tooLong = p.channel.receive(5);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 4s);
  ASSERT_FALSE(tooLong.isOk());
  EXPECT_EQ(tooLong.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(tooLong.status().message().find("a line longer than 64 bytes"), std::string::npos)
      << tooLong.status().message();
}

TEST(ControlChannel, AnEmptyLineIsAMalformedMessageNotSkipped) {
  ChannelPair p(4096);
  p.write(
      "\n"
      R"({"ferry_test": 1, "type": "after"})"
      "\n");
  EXPECT_TRUE(p.channel.readable(2000));
  auto empty = p.channel.receive(5);
  ASSERT_FALSE(empty.isOk());
  EXPECT_EQ(empty.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(empty.status().message().find("malformed control message"), std::string::npos)
      << empty.status().message();
  EXPECT_TRUE(p.channel.expect("after", 5).isOk());
}

TEST(ControlChannel, AnEndOfFileInsideAMessageIsToldFromAnOrderlyOne) {
  ChannelPair cut(4096);
  cut.write(R"({"ferry_test": 1, "ty)");
  ::shutdown(cut.peer, SHUT_WR);
  auto partial = cut.channel.receive(5);
  ASSERT_FALSE(partial.isOk());
  EXPECT_EQ(partial.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(partial.status().message().find("in the middle of a message"), std::string::npos)
      << partial.status().message();

  ChannelPair orderly(4096);
  orderly.write(R"({"ferry_test": 1, "type": "last"})"
                "\n");
  ::shutdown(orderly.peer, SHUT_WR);
  ASSERT_TRUE(orderly.channel.expect("last", 5).isOk());
  auto end = orderly.channel.receive(5);
  ASSERT_FALSE(end.isOk());
  EXPECT_EQ(end.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(end.status().message(), "the peer closed the control connection");
}

}  // namespace
}  // namespace ferry
