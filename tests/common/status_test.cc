#include "ferry/common/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

namespace ferry {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_TRUE(static_cast<bool>(s));
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.cause(), 0);
  EXPECT_EQ(s.toString(), "Ok");
  EXPECT_TRUE(Status::ok().isOk());
}

TEST(StatusTest, ToStringWithErrno) {
  Status s = invalidArgument("bad queue pair");
  EXPECT_FALSE(s.isOk());
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_EQ(s.toString(), "InvalidArgument: bad queue pair (errno 22: Invalid argument)");
}

TEST(StatusTest, ToStringWithoutCauseHasNoErrnoPart) {
  Status s(StatusCode::kTimedOut, "no completion within 10 ms");
  EXPECT_EQ(s.toString(), "TimedOut: no completion within 10 ms");
  EXPECT_EQ(s.toString().find("errno"), std::string::npos);
}

TEST(StatusTest, WorkCompletionCauseIsNotPrintedAsErrno) {
  // cause() of a kWorkCompletionError is a WC status (12 = RETRY_EXC_ERR), not ENOMEM.
  Status s(StatusCode::kWorkCompletionError, "send failed", 12);
  EXPECT_EQ(s.toString(), "WorkCompletionError: send failed (wc status 12)");
}

TEST(StatusTest, ShorthandsSetCodeAndLibibverbsErrno) {
  struct Case {
    Status status;
    StatusCode code;
    int cause;
  };
  Case cases[] = {
      {invalidArgument("a"), StatusCode::kInvalidArgument, EINVAL},
      {notSupported("b"), StatusCode::kNotSupported, EOPNOTSUPP},
      {notFound("c"), StatusCode::kNotFound, ENOENT},
      {resourceExhausted("d"), StatusCode::kResourceExhausted, ENOMEM},
      {closedError("e"), StatusCode::kClosed, EBADF},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.status.toString();
    EXPECT_EQ(c.status.cause(), c.cause) << c.status.toString();
    EXPECT_NE(c.status.toString().find(std::strerror(c.cause)), std::string::npos) << c.status.toString();
  }
  EXPECT_EQ(notFound("no device soft_x").message(), "no device soft_x");
}

TEST(StatusTest, IoErrorAppendsStrerror) {
  Status s = ioError("connect 10.0.0.1:4791", ECONNREFUSED);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.cause(), ECONNREFUSED);
  EXPECT_EQ(s.message(), std::string("connect 10.0.0.1:4791: ") + std::strerror(ECONNREFUSED));
  EXPECT_EQ(s.toString(), "IoError: connect 10.0.0.1:4791: " + std::string(std::strerror(ECONNREFUSED)) +
                              " (errno " + std::to_string(ECONNREFUSED) + ": " + std::strerror(ECONNREFUSED) +
                              ")");
}

TEST(StatusTest, IoErrorDefaultsToErrno) {
  errno = EACCES;
  Status s = ioError("open /dev/infiniband/uverbs0");
  EXPECT_EQ(s.cause(), EACCES);
  EXPECT_NE(s.message().find(std::strerror(EACCES)), std::string::npos);
}

TEST(StatusTest, EveryCodeHasItsOwnName) {
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(StatusCode::kPeerGone); ++i) {
    std::string name = statusCodeName(static_cast<StatusCode>(i));
    EXPECT_NE(name, "Unknown") << "code " << i;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(StatusCode::kPeerGone) + 1);
  EXPECT_STREQ(statusCodeName(StatusCode::kProtocolError), "ProtocolError");
  EXPECT_STREQ(statusCodeName(StatusCode::kWorkCompletionError), "WorkCompletionError");
  // A code from a newer build still prints.
  EXPECT_STREQ(statusCodeName(static_cast<StatusCode>(999)), "Unknown");
  EXPECT_EQ(Status(static_cast<StatusCode>(999), "x").toString(), "Unknown: x");
}

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> good = 42;
  ASSERT_TRUE(good.isOk());
  EXPECT_EQ(*good, 42);
  EXPECT_TRUE(good.status().isOk());

  Result<std::string> bad = notFound("no such key");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "no such key");
}

TEST(ResultTest, OkStatusBecomesInternalError) {
  Result<int> r = Status::ok();
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

Status failsWhenNegative(int x) {
  if (x < 0) return invalidArgument("negative");
  return Status::ok();
}

Result<int> doubled(int x) {
  FERRY_RETURN_IF_ERROR(failsWhenNegative(x));
  return 2 * x;
}

Result<int> quadrupled(int x) {
  FERRY_ASSIGN_OR_RETURN(int twice, doubled(x));
  return 2 * twice;
}

TEST(ResultTest, MacrosPropagateTheFirstError) {
  Result<int> ok = quadrupled(3);
  ASSERT_TRUE(ok.isOk());
  EXPECT_EQ(*ok, 12);
  Result<int> bad = quadrupled(-1);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "negative");
}

}  // namespace
}  // namespace ferry
