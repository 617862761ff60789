// Configuration from the environment: every FERRY_* variable ferry reads, in one table.
//
// Each variable has a meaning, a default and the values it takes. ferry reads them only through
// this header. A set variable whose value is not valid is an error that names it: check() returns
// it, and everything that opens devices or starts an agent calls check() first, so a typo never
// passes silently; nor does a misspelt name: the first check() logs a warning for each FERRY_*
// variable that is not in the table (unknownVariables()). `ferry info --config` and Python's
// `ferry.config()` print the effective settings; docs/configuration.md is the same table for readers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::config {

struct Variable {
  const char* name;         // e.g. "FERRY_DEVICES"
  const char* meaning;      // one sentence
  const char* defaultText;  // what applies when it is unset
  const char* validValues;  // the values it takes, in words
  // The value in effect for `raw` (a set, non-empty value), or InvalidArgument naming the variable.
  Result<std::string> (*parse)(std::string_view raw);
};

// The table, in the order the docs list it.
const std::vector<Variable>& variables();

// One variable as this process sees it.
struct Setting {
  const Variable* variable = nullptr;
  bool set = false;       // present and non-empty in the environment
  std::string raw;        // its value as set
  std::string effective;  // the value in effect (the default when unset)
  std::string error;      // why `raw` is refused; empty when valid
};
std::vector<Setting> settings();

// OK when every set variable holds a valid value; otherwise InvalidArgument for the first that
// does not, e.g. "FERRY_SOFT_SPIN_US=abc: expected a whole number of microseconds, 0..10000".
// The first call in a process also logs, at WARN, each unknownVariables() entry's warning().
Status check();

// Variables that ferry's own tests, benchmarks and scripts read and the library never does. They
// start with FERRY_ but are not configuration: unknownVariables() does not report them.
struct ReservedVariable {
  const char* name;    // e.g. "FERRY_TEST_BIN_DIR"
  const char* readBy;  // who reads it, in a few words
};
const std::vector<ReservedVariable>& reservedVariables();

// A FERRY_* variable present in the environment (set, even if empty) that is neither in
// variables() nor in reservedVariables(): most likely a misspelling, which ferry would otherwise
// ignore without a word.
struct UnknownVariable {
  std::string name;        // as set, e.g. "FERRY_DEVICE"
  std::string suggestion;  // the nearest known name (at most two edits away), or empty
  // The former name of a renamed variable (suggestion is its current name): still read where the
  // current name is unset.
  bool renamed = false;
  // "FERRY_DEVICE is not a ferry variable (did you mean FERRY_DEVICES?); ferry info --config lists
  // them", or for a renamed one "FERRY_X is the former name of FERRY_Y, read while that is unset;
  // set FERRY_Y instead"
  std::string warning() const;
};
// Every unknown FERRY_* variable of this environment, sorted by name.
std::vector<UnknownVariable> unknownVariables();

// ---- typed readers (an invalid value reads as unset: check() is where it is reported) ----

// FERRY_DEVICES: the device names to show, or nullopt for all.
std::optional<std::vector<std::string>> devices();
// FERRY_SOFT_SAME_HOST.
enum class SameHost { kAuto, kOff, kRingOnly };
SameHost softSameHost();
// FERRY_SOFT_RING_BYTES, or nullopt for the default.
std::optional<uint64_t> softRingBytes();
// FERRY_SOFT_SPIN_US, or nullopt for the default (which depends on the number of cores).
std::optional<int64_t> softSpinUs();
// FERRY_SOFT_CALLER_PROGRESS (default on): whether posts and empty polls of a soft device's CQs
// run the device's progress loop on the calling thread when its progress thread is not.
bool softCallerProgress();
// FERRY_SOFT_TCP_STRIPE (default on: 1 MiB): the smallest WRITE whose second half a soft QP that
// reaches its peer over TCP sends on a second connection, from a thread of its own (0: none). The
// connection opens with the first such WRITE.
uint64_t softTcpStripeMinBytes();
// FERRY_SOFT_ATTEND_US (default 1000): how long a poll of a soft device's CQ vouches that the
// application polls, so that same-host peers write into its rings without waking its thread.
int64_t softAttendUs();
// FERRY_WAIT_SPIN_US (default 50): how long a thread waiting for an Endpoint operation polls its
// completions itself before it sleeps.
int64_t waitSpinUs();
// FERRY_WAIT_LEASE_US (default 1000): how long, after a waiter polled its Endpoint operation to
// completion, the endpoint's worker leaves completions to the next waiters' polls.
int64_t waitLeaseUs();
// FERRY_TRANSPORT_TIMEOUT in seconds (default 30).
int transportTimeoutSeconds();
// FERRY_IB_GID_INDEX, or nullopt to choose by GID type.
std::optional<int> ibGidIndex();
// FERRY_IBVERBS_LIBRARY (default "libibverbs.so.1").
std::string ibverbsLibrary();
// FERRY_CUDA_LIBRARY: the CUDA driver library ferry loads at run time (default libcuda.so.1).
std::string cudaLibrary();
// FERRY_LOG_LEVEL as 0 error, 1 warn, 2 info, 3 debug.
int logLevel();
// FERRY_AGENT_SECRET, FERRY_AGENT_LANES, FERRY_STORE: the raw value, empty when unset.
std::string agentSecret();
std::string agentLanes();
// FERRY_AGENT_ALLOW_REMOTE: whether an agent without a secret serves other hosts (default false).
bool agentAllowRemote();
std::string store();
// FERRY_OBJECTS_TOKEN_TTL: seconds an object client's descriptor stays valid (default 300).
int objectsTokenTtlSeconds();
// FERRY_OBJECTS_ACCESS_KEY / FERRY_OBJECTS_SECRET_KEY: the object store's credentials ("" : none).
std::string objectsAccessKey();
std::string objectsSecretKey();
// Whether a variable holds a secret (its value is never printed).
bool isSecret(std::string_view name);

// A byte count: digits with an optional K, M or G (binary) suffix and an optional "B"/"iB"
// ("4096", "4K", "16M", "1GiB"). Zero and values past 2^64 are refused.
Result<uint64_t> parseByteSize(std::string_view text);

}  // namespace ferry::config
