// The soft provider's same-host path: the owner's table refuses exactly what the owner would, a
// deregistration waits for a copy in progress (and not for a dead accessor), a table is reached
// only by a process that proves it can read the owner's memory, and WRITE/READ through the verbs
// API take the path and fall back to TCP for whatever the table refuses.
#include "providers/soft/same_host/share.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <shared_mutex>
#include <thread>

#include "ferry/common/shared_memory.h"
#include "providers/soft/soft.h"
#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
using soft::SharePeer;
using soft::ShareTable;

constexpr uint32_t kOwnerQpn = 0x1234;
constexpr uint32_t kAccessorQpn = 0x5678;
constexpr uint32_t kRw = v::access::kRemoteWrite | v::access::kRemoteRead;

struct Table {
  std::unique_ptr<ShareTable> table;
  std::shared_ptr<SharePeer> peer;
  std::unique_ptr<SharePeer::Slot> slot;
  std::vector<uint8_t> memory = std::vector<uint8_t>(1 << 16);
  int pd = 0;  // its address is the PD token
  uint32_t key = 0x00abcd01;
};

void openTable(Table& t) {
  auto table = ShareTable::create();
  ASSERT_TRUE(isOk(table.status()));
  t.table = std::move(*table);
  t.table->publishQp(kOwnerQpn, v::QpState::kRts, kRw, &t.pd, kAccessorQpn);
  ASSERT_TRUE(t.table->keyFits(t.key));
  t.table->publishMr(t.key, t.memory.data(), t.memory.size(), kRw | v::access::kLocalWrite, &t.pd);
  auto peer = SharePeer::open(t.table->info());
  ASSERT_TRUE(isOk(peer.status()));
  t.peer = *peer;
  auto slot = SharePeer::claim(t.peer);
  ASSERT_TRUE(isOk(slot.status()));
  t.slot = std::move(*slot);
}

uint64_t addr(const Table& t, size_t offset = 0) {
  return reinterpret_cast<uintptr_t>(t.memory.data() + offset);
}

TEST(ShareTable, AccessIsCheckedAgainstTheOwnersRecords) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  auto allowed = [&](uint32_t qpn, uint32_t src, uint32_t key, uint64_t a, uint64_t len, uint32_t need) {
    bool ok = t.slot->begin(qpn, src, key, a, len, need);
    if (ok) t.slot->end();
    return ok;
  };
  EXPECT_TRUE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), t.memory.size(), v::access::kRemoteWrite));
  EXPECT_TRUE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t, 100), 28, v::access::kRemoteRead));
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key ^ 0x100, addr(t), 8, v::access::kRemoteWrite))
      << "other key";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t, 1), t.memory.size(), v::access::kRemoteWrite))
      << "one byte past the end";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t) - 1, 8, v::access::kRemoteWrite)) << "before";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, ~uint64_t{0} - 3, 8, v::access::kRemoteWrite))
      << "wraps";
  EXPECT_FALSE(allowed(kOwnerQpn + 1, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite))
      << "other QP";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn + 1, t.key, addr(t), 8, v::access::kRemoteWrite))
      << "the owner's QP is connected to another peer";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteAtomic))
      << "not granted";

  // The region's own access, the QP's access flags, its state and its PD all count.
  uint32_t readOnly = 0x00abce02;
  t.table->publishMr(readOnly, t.memory.data(), 64, v::access::kRemoteRead, &t.pd);
  EXPECT_TRUE(allowed(kOwnerQpn, kAccessorQpn, readOnly, addr(t), 8, v::access::kRemoteRead));
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, readOnly, addr(t), 8, v::access::kRemoteWrite));
  t.table->publishQp(kOwnerQpn, v::QpState::kRts, v::access::kRemoteRead, &t.pd, kAccessorQpn);
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite));
  t.table->publishQp(kOwnerQpn, v::QpState::kRtr, kRw, &t.pd, kAccessorQpn);
  EXPECT_TRUE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite)) << "RTR responds";
  for (auto state : {v::QpState::kErr, v::QpState::kInit, v::QpState::kReset, v::QpState::kSqd}) {
    t.table->publishQp(kOwnerQpn, state, kRw, &t.pd, kAccessorQpn);
    EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite))
        << v::qpStateName(state);
  }
  int otherPd = 0;
  t.table->publishQp(kOwnerQpn, v::QpState::kRts, kRw, &otherPd, kAccessorQpn);
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite)) << "other PD";
  t.table->publishQp(kOwnerQpn, v::QpState::kRts, kRw, &t.pd, kAccessorQpn);
  t.table->retractQp(kOwnerQpn);
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite)) << "QP gone";
  t.table->publishQp(kOwnerQpn, v::QpState::kRts, kRw, &t.pd, kAccessorQpn);
  t.table->withdrawMr(t.key);
  t.table->waitForAccessors(t.key);
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite))
      << "deregistered";
  EXPECT_FALSE(allowed(kOwnerQpn, kAccessorQpn, 0, addr(t), 8, v::access::kRemoteWrite)) << "key 0";
}

TEST(ShareTable, CopiesMoveBytesBothWays) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  std::vector<uint8_t> a(3000), b(5000);
  fillPattern(a, 1);
  fillPattern(b, 2);
  iovec two[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  ASSERT_TRUE(t.slot->begin(kOwnerQpn, kAccessorQpn, t.key, addr(t, 7), 8000, v::access::kRemoteWrite));
  EXPECT_TRUE(t.slot->copy(true, two, addr(t, 7), 8000));
  t.slot->end();
  EXPECT_TRUE(matchesPattern({t.memory.data() + 7, 3000}, 1));
  EXPECT_TRUE(matchesPattern({t.memory.data() + 3007, 5000}, 2));
  std::vector<uint8_t> back(8000);
  iovec one{back.data(), back.size()};
  EXPECT_TRUE(t.slot->copy(false, {&one, 1}, addr(t, 7), 8000));
  EXPECT_TRUE(bytesEqual({back.data(), 3000}, a));
  // An address the owner has not mapped fails the copy (the caller then goes over TCP).
  EXPECT_FALSE(t.slot->copy(false, {&one, 1}, 8, 8000));
}

TEST(ShareTable, DeregistrationWaitsForACopyInProgress) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  ASSERT_TRUE(t.slot->begin(kOwnerQpn, kAccessorQpn, t.key, addr(t), 64, v::access::kRemoteWrite));
  std::atomic<bool> returned{false};
  auto dereg = std::async(std::launch::async, [&] {
    t.table->withdrawMr(t.key);
    t.table->waitForAccessors(t.key);
    returned = true;
  });
  // No new access starts once the record is withdrawn...
  for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
    auto claimed = SharePeer::claim(t.peer);
    ASSERT_TRUE(isOk(claimed.status()));
    std::unique_ptr<SharePeer::Slot> other = std::move(*claimed);
    bool refused = !other->begin(kOwnerQpn, kAccessorQpn, t.key, addr(t), 64, v::access::kRemoteWrite);
    if (!refused) other->end();
    if (refused) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // ...but the one in progress holds the deregistration until it ends.
  EXPECT_EQ(dereg.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_FALSE(returned.load());
  t.slot->end();
  ASSERT_EQ(dereg.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(returned.load());
}

// Another process reaches the table, starts a copy and dies in the middle of it. With reap false it
// stays a zombie (killed, not yet waited for: the normal state of a dead child under
// multiprocessing) while the owner deregisters.
void deadAccessorReleasesDeregistration(bool reap) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  const soft::ShareInfo info = t.table->info();
  const uint32_t key = t.key;
  const uint64_t where = addr(t);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto peer = SharePeer::open(info);
    if (!peer.isOk()) _exit(2);
    auto slot = SharePeer::claim(*peer);
    if (!slot.isOk()) _exit(3);
    if (!(*slot)->begin(kOwnerQpn, kAccessorQpn, key, where, 64, v::access::kRemoteWrite)) _exit(4);
    (void)(*slot).release();  // never ends the copy, never releases the slot
    _exit(0);
  }
  siginfo_t info2{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info2, WEXITED | (reap ? 0 : WNOWAIT)), 0);
  ASSERT_EQ(info2.si_code, CLD_EXITED);
  ASSERT_EQ(info2.si_status, 0) << "the child could not open, claim or begin (exit code)";
  auto dereg = std::async(std::launch::async, [&] {
    t.table->withdrawMr(key);
    t.table->waitForAccessors(key);
  });
  EXPECT_EQ(dereg.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "deregistration still waits for a process that is gone" << (reap ? "" : " (a zombie)");
  if (!reap) EXPECT_EQ(waitpid(child, nullptr, 0), child);
  dereg.wait();
  // The dead process's slot is taken back when slots run out; claiming still works.
  EXPECT_TRUE(isOk(SharePeer::claim(t.peer).status()));
}

TEST(ShareTable, ADeadAccessorDoesNotHoldDeregistration) { deadAccessorReleasesDeregistration(true); }

TEST(ShareTable, AZombieAccessorDoesNotHoldDeregistration) { deadAccessorReleasesDeregistration(false); }

TEST(ShareTable, OnlyTheTableTheOwnerDescribedOpens) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  soft::ShareInfo wrong = t.table->info();
  wrong.cookie ^= 1;
  EXPECT_TRUE(hasCode(SharePeer::open(wrong).status(), StatusCode::kUnavailable));
  soft::ShareInfo noFd = t.table->info();
  noFd.fd = 1 << 20;
  EXPECT_TRUE(hasCode(SharePeer::open(noFd).status(), StatusCode::kUnavailable));
  soft::ShareInfo notATable = t.table->info();
  notATable.fd = 0;  // stdin: not a table
  EXPECT_TRUE(hasCode(SharePeer::open(notATable).status(), StatusCode::kUnavailable));
  EXPECT_TRUE(hasCode(SharePeer::open(soft::ShareInfo{}).status(), StatusCode::kUnavailable));
}

// Memory both sides map: a region inside ferry's shared memory is reached through a mapping of
// its memfd (loads and stores), at the right offset, and only while the owner's records allow it.
TEST(ShareTable, SharedMemoryIsCopiedThroughAMapping) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  ASSERT_OK_AND_ASSIGN(auto memory, SharedMemory::allocate(3 * 4096));
  auto* owner = static_cast<uint8_t*>(memory->data());
  const uint32_t key = 0x00abcf03;
  // The region starts a page into the allocation: the mapping must honour the offset.
  t.table->publishMr(key, owner + 4096, 8192, kRw | v::access::kLocalWrite, &t.pd);
  const uint64_t at = reinterpret_cast<uintptr_t>(owner + 4096);
  std::vector<uint8_t> local(8192);
  fillPattern(local, 41);
  ASSERT_TRUE(t.slot->begin(kOwnerQpn, kAccessorQpn, key, at + 100, 4000, v::access::kRemoteWrite));
  EXPECT_TRUE(t.slot->mapped());
  iovec piece{local.data(), 4000};
  EXPECT_TRUE(t.slot->copy(true, std::span<const iovec>(&piece, 1), at + 100, 4000));
  t.slot->end();
  EXPECT_TRUE(std::equal(local.begin(), local.begin() + 4000, owner + 4096 + 100));
  EXPECT_TRUE(std::all_of(owner, owner + 4096 + 100, [](uint8_t b) { return b == 0; }))
      << "nothing before it";

  // Several pieces in one call, and a READ back.
  std::vector<uint8_t> back(8192);
  iovec locals[2] = {{back.data(), 3000}, {back.data() + 3000, 1000}};
  iovec remotes[2] = {{reinterpret_cast<void*>(at + 100), 2000}, {reinterpret_cast<void*>(at + 2100), 2000}};
  ASSERT_TRUE(t.slot->begin(kOwnerQpn, kAccessorQpn, key, at + 100, 4000, v::access::kRemoteRead));
  EXPECT_TRUE(t.slot->copyv(false, locals, remotes));
  t.slot->end();
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 4000, local.begin()));

  // Plain memory is not in shared memory: the system-call path, as before.
  ASSERT_TRUE(t.slot->begin(kOwnerQpn, kAccessorQpn, t.key, addr(t), 8, v::access::kRemoteWrite));
  EXPECT_FALSE(t.slot->mapped());
  t.slot->end();

  // Withdrawn, the region is refused through the mapping too.
  t.table->withdrawMr(key);
  EXPECT_FALSE(t.slot->begin(kOwnerQpn, kAccessorQpn, key, at, 8, v::access::kRemoteWrite));
}

// Only a size-sealed memfd with the inode the record names is mapped: a file that could shrink
// under the mapping would fault the accessor, and a reused descriptor number is another file.
TEST(ShareTable, OnlyASizeSealedMemfdOfTheRecordedInodeIsMapped) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  ASSERT_OK_AND_ASSIGN(auto memory, SharedMemory::allocate(4096));
  struct stat st {};
  ASSERT_EQ(::fstat(memory->fd(), &st), 0);
  EXPECT_NE(t.peer->mapping(static_cast<uint32_t>(memory->fd()), st.st_ino), nullptr);
  EXPECT_EQ(t.peer->mapping(static_cast<uint32_t>(memory->fd()), st.st_ino + 1), nullptr) << "another inode";
  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 4096), 0);
  ASSERT_EQ(::fstat(unsealed, &st), 0);
  EXPECT_EQ(t.peer->mapping(static_cast<uint32_t>(unsealed), st.st_ino), nullptr) << "may shrink";
  ::close(unsealed);
  EXPECT_EQ(t.peer->mapping(1u << 20, 1), nullptr) << "no such descriptor";
}

// Memory the owner freed is not kept alive by our mapping: a sweep drops mappings of memfds the
// owner no longer holds, and keeps those it holds and those a slot uses.
TEST(ShareTable, MappingsOfFreedMemoryAreDropped) {
  Table t;
  ASSERT_NO_FATAL_FAILURE(openTable(t));
  ASSERT_OK_AND_ASSIGN(auto kept, SharedMemory::allocate(4096));
  ASSERT_OK_AND_ASSIGN(auto freed, SharedMemory::allocate(4096));
  struct stat st {};
  ASSERT_EQ(::fstat(kept->fd(), &st), 0);
  std::weak_ptr<SharePeer::Mapping> keptMap = t.peer->mapping(static_cast<uint32_t>(kept->fd()), st.st_ino);
  ASSERT_EQ(::fstat(freed->fd(), &st), 0);
  const uint32_t freedFd = static_cast<uint32_t>(freed->fd());
  std::weak_ptr<SharePeer::Mapping> freedMap = t.peer->mapping(freedFd, st.st_ino);
  ASSERT_FALSE(keptMap.expired());
  ASSERT_FALSE(freedMap.expired());
  freed.reset();  // the owner frees it: its memfd closes
  t.peer->sweepMappings(/*now=*/true);
  EXPECT_TRUE(freedMap.expired()) << "the mapping of freed memory outlived the sweep";
  EXPECT_FALSE(keptMap.expired()) << "the owner still holds this one";
}

TEST(ShareTable, TheVariableForcesTcp) {
  ScopedEnv env;
  env.set("FERRY_SOFT_SAME_HOST", "0");
  std::string why;
  EXPECT_FALSE(soft::sameHostAllowed(&why));
  EXPECT_NE(why.find("FERRY_SOFT_SAME_HOST=0"), std::string::npos) << why;
}

// Through the verbs API, on the soft_same_host path only.
class SameHostPath : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    if (!carriesOutInThePost(providerPath())) GTEST_SKIP() << "the same-host path is the soft provider's";
    if (!soft::sameHostAllowed()) GTEST_SKIP() << "this kernel refuses process_vm_readv here";
  }
  void runWhosePathGoes(bool* parked);
};

TEST_P(SameHostPath, WritesAndReadsTakeThePathAndFallBackForWhatItRefuses) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 << 20, v::access::kLocalWrite, 91));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 << 20, v::access::kAll, 92));
  // The first WRITE may go over TCP while the requester connection comes up.
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_EQ(wc.status, v::WcStatus::kSuccess);

  const uint64_t before = soft::sameHostOpsDone();
  const uint64_t mappedBefore = soft::sameHostMappedOpsDone();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 1 << 20)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  fillPattern(dst.memory.bytes(), 93);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaRead,
                              .wrId = 3,
                              .sges = {sgeOf(src, 0, 1 << 20)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(matchesPattern(bytesOf(src), 93));
  EXPECT_EQ(soft::sameHostOpsDone(), before + 2) << "the WRITE and the READ took the same-host path";
  // On soft_mapped every test buffer is shared memory: both were loads and stores.
  EXPECT_EQ(soft::sameHostMappedOpsDone(), mappedBefore + (providerPath().name == "soft_mapped" ? 2 : 0));

  // A key the owner no longer has is refused by its records: the WRITE goes over TCP, where the
  // owner reports it as ever.
  const uint32_t oldKey = dst.mr.rkey();
  dst.mr.close();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 4,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = dst.address(),
                              .rkey = oldKey}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kRemAccessErr);
  EXPECT_EQ(soft::sameHostOpsDone(), before + 2);
}

// Memory from ProtectionDomain::allocMr: the peer maps it once and WRITE, READ and batches of
// them are loads and stores, byte-exact, refused like any other once the region is closed.
TEST_P(SameHostPath, AllocatedMemoryIsReachedThroughAMapping) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = {.cap = {.maxSendWr = 128,
                                                            .maxRecvWr = 16,
                                                            .maxSendSge = 4,
                                                            .maxRecvSge = 4,
                                                            .maxInlineData = 0}}}));
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion src, pair->a.pd.allocMr(1 << 20, v::access::kLocalWrite));
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion dst, pair->b.pd.allocMr(1 << 20, v::access::kAll));
  std::span<uint8_t> srcBytes(static_cast<uint8_t*>(src.addr()), src.length());
  std::span<uint8_t> dstBytes(static_cast<uint8_t*>(dst.addr()), dst.length());
  const auto dstAddr = reinterpret_cast<uintptr_t>(dst.addr());
  fillPattern(srcBytes, 51);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {src.sge(0, 64)},
                              .remoteAddr = dstAddr,
                              .rkey = dst.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));  // connected
  ASSERT_EQ(wc.status, v::WcStatus::kSuccess);

  const uint64_t before = soft::sameHostMappedOpsDone();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 2,
                              .sges = {src.sge(0, 1 << 20)},
                              .remoteAddr = dstAddr,
                              .rkey = dst.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(std::equal(srcBytes.begin(), srcBytes.end(), dstBytes.begin()));
  fillPattern(dstBytes, 52);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaRead,
                              .wrId = 3,
                              .sges = {src.sge(8, 4096)},
                              .remoteAddr = dstAddr + 100,
                              .rkey = dst.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(std::equal(srcBytes.begin() + 8, srcBytes.begin() + 8 + 4096, dstBytes.begin() + 100));
  EXPECT_EQ(soft::sameHostMappedOpsDone(), before + 2) << "the WRITE and the READ were loads and stores";

  // 32 small WRITEs posted together, reversed: one batch through the mapping.
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 32; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 10 + i,
                   .sges = {src.sge(i * 64, 64)},
                   .flags = i == 31 ? v::send_flags::kSignaled : 0u,
                   .remoteAddr = dstAddr + (31 - i) * 64,
                   .rkey = dst.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(wc.wrId, 41u);
  for (uint64_t i = 0; i < 32; ++i) {
    EXPECT_TRUE(std::equal(srcBytes.begin() + i * 64, srcBytes.begin() + (i + 1) * 64,
                           dstBytes.begin() + (31 - i) * 64))
        << "write " << i;
  }
  EXPECT_EQ(soft::sameHostMappedOpsDone(), before + 34);

  // Atomics on it are instructions on the mapping: fetch-and-add, then a compare-and-swap that
  // matches and one that does not; each returns the value before it.
  auto* word = reinterpret_cast<uint64_t*>(dstBytes.data() + 4096);
  *word = 40;
  auto atomic = [&](v::WrOpcode op, uint64_t compareAdd, uint64_t swap) {
    ASSERT_OK(post(pair->a.qp, {.opcode = op,
                                .wrId = 50,
                                .sges = {src.sge(8, 8)},
                                .remoteAddr = dstAddr + 4096,
                                .rkey = dst.rkey(),
                                .compareAdd = compareAdd,
                                .swap = swap}));
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  };
  auto returned = [&] { return *reinterpret_cast<const uint64_t*>(srcBytes.data() + 8); };
  atomic(v::WrOpcode::kAtomicFetchAndAdd, 2, 0);
  EXPECT_EQ(returned(), 40u);
  EXPECT_EQ(*word, 42u);
  atomic(v::WrOpcode::kAtomicCmpAndSwp, 42, 7);
  EXPECT_EQ(returned(), 42u);
  EXPECT_EQ(*word, 7u);
  atomic(v::WrOpcode::kAtomicCmpAndSwp, 42, 9);
  EXPECT_EQ(returned(), 7u);
  EXPECT_EQ(*word, 7u) << "no match, no swap";
  EXPECT_EQ(soft::sameHostMappedOpsDone(), before + 37);

  // Closed, the region's key is refused (over TCP, by the owner) and its memory is not touched:
  // the peer's mapping outlives the region, the records do not.
  const uint32_t oldKey = dst.rkey();
  dst.close();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 4,
                              .sges = {src.sge(0, 64)},
                              .remoteAddr = dstAddr,
                              .rkey = oldKey}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kRemAccessErr);
  EXPECT_EQ(soft::sameHostMappedOpsDone(), before + 37);
}

TEST_P(SameHostPath, WriteWithImmediatePlacesTheDataAndSendsOnlyTheImmediate) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 << 20, v::access::kLocalWrite, 94));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 << 20, v::access::kAll, 95));
  ASSERT_OK_AND_ASSIGN(auto sink, registerBuffer(pair->b.pd, 64, v::access::kLocalWrite, 96));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));  // the requester connection is up now
  fillPattern(src.memory.bytes(), 97);

  // No receive posted yet: the data is placed at once, the immediate waits (receiver not ready)
  // and arrives, once, when a receive is posted; the WRITE completes after that.
  const uint64_t before = soft::sameHostOpsDone();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWriteWithImm,
                              .wrId = 2,
                              .sges = {sgeOf(src, 4096, 512 * 1024)},
                              .remoteAddr = dst.address(8),
                              .rkey = dst.mr.rkey(),
                              .imm = 0xfeedf00d}));
  EXPECT_EQ(soft::sameHostOpsDone(), before + 1);
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, std::chrono::milliseconds(50)));
  ASSERT_OK(postReceive(pair->b.qp, 7, {sgeOf(sink, 0, 64)}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(wc.wrId, 7u);
  EXPECT_EQ(wc.opcode, v::WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(wc.byteLen, 512u * 1024);
  EXPECT_EQ(wc.immData, 0xfeedf00du);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 8, 512 * 1024), 97, 4096));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.wrId, 2u);
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(wc.byteLen, 512u * 1024);
  EXPECT_TRUE(noCompletionFor(pair->b.recvCq, std::chrono::milliseconds(20))) << "the immediate came twice";
}

TEST_P(SameHostPath, RequestsPostedTogetherMoveTogetherAndKeepTheirMeaning) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = {.cap = {.maxSendWr = 128,
                                                            .maxRecvWr = 16,
                                                            .maxSendSge = 4,
                                                            .maxRecvSge = 4,
                                                            .maxInlineData = 0}}}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * 1024, v::access::kLocalWrite, 31));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * 1024, v::access::kAll, 32));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 100,
                              .sges = {sgeOf(src, 0, 8)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));  // connected
  fillPattern(dst.memory.bytes(), 33);

  // 32 WRITEs of 1 KiB, each from its own place to its own place (reversed order), two SGEs each,
  // every fourth signaled: their bytes land where each says, and only the signaled ones complete.
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 32; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = i,
                   .sges = {sgeOf(src, i * 1024, 512), sgeOf(src, i * 1024 + 512, 512)},
                   .flags = i % 4 == 3 ? v::send_flags::kSignaled : 0u,
                   .remoteAddr = dst.address((31 - i) * 1024),
                   .rkey = dst.mr.rkey()});
  }
  uint64_t before = soft::sameHostOpsDone();
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<v::WorkCompletion> wcs;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 8, &wcs));
  for (size_t k = 0; k < wcs.size(); ++k) {
    EXPECT_EQ(wcs[k].status, v::WcStatus::kSuccess);
    EXPECT_EQ(wcs[k].wrId, 4 * k + 3) << "in post order, signaled ones only";
  }
  EXPECT_EQ(soft::sameHostOpsDone(), before + 32);
  for (uint64_t i = 0; i < 32; ++i) {
    EXPECT_TRUE(bytesEqual(bytesOf(dst, (31 - i) * 1024, 1024), bytesOf(src, i * 1024, 1024)))
        << "write " << i;
  }
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 32 * 1024, 32 * 1024), 33, 32 * 1024))
      << "nothing beyond them moved";

  // READs posted together come back the same way.
  fillPattern(src.memory.bytes(), 34);
  ops.clear();
  for (uint64_t i = 0; i < 16; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaRead,
                   .wrId = 200 + i,
                   .sges = {sgeOf(src, i * 2048, 2048)},
                   .remoteAddr = dst.address(i * 2048),
                   .rkey = dst.mr.rkey()});
  }
  before = soft::sameHostOpsDone();
  ASSERT_OK(postAll(pair->a.qp, ops));
  wcs.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 16, &wcs));
  for (size_t k = 0; k < wcs.size(); ++k) EXPECT_EQ(wcs[k].wrId, 200 + k);
  EXPECT_EQ(soft::sameHostOpsDone(), before + 16);
  EXPECT_TRUE(bytesEqual(bytesOf(src, 0, 32 * 1024), bytesOf(dst, 0, 32 * 1024)));

  // One request of a run reaching past the region: the ones before it succeed, it fails with
  // REM_ACCESS_ERR and writes nothing, the rest are flushed.
  ops.clear();
  for (uint64_t i = 0; i < 4; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 300 + i,
                   .sges = {sgeOf(src, 0, 1024)},
                   .remoteAddr = dst.address(i == 2 ? 64 * 1024 - 512 : i * 1024),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  wcs.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &wcs));
  const v::WcStatus expected[4] = {v::WcStatus::kSuccess, v::WcStatus::kSuccess, v::WcStatus::kRemAccessErr,
                                   v::WcStatus::kWrFlushErr};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(wcs[k].wrId, 300 + k);
    EXPECT_EQ(wcs[k].status, expected[k]) << "request " << k;
  }
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 64 * 1024 - 512, 512), 33, 64 * 1024 - 512));
}

TEST_P(SameHostPath, LargeRequestsCopiedByTwoThreadsLandWhole) {
  // From 4 MiB a same-host copy is split between the posting thread and the context's helper:
  // one WRITE whose SGE boundaries straddle the split, one READ back, and a run of WRITEs that
  // together pass the threshold (split between requests).
  constexpr size_t kBig = 12u << 20;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kBig, v::access::kLocalWrite, 41));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kBig + 4096, v::access::kAll, 42));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 8)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));  // connected
  fillPattern(dst.memory.bytes(), 43);

  const uint64_t splitBefore = soft::sameHostSplitCopies();
  uint64_t before = soft::sameHostOpsDone();
  const size_t cut1 = (5u << 20) + 123, cut2 = (6u << 20) + 4097;  // around the 6 MiB split
  ASSERT_OK(post(pair->a.qp,
                 {.opcode = v::WrOpcode::kRdmaWrite,
                  .wrId = 2,
                  .sges = {sgeOf(src, 0, cut1), sgeOf(src, cut1, cut2 - cut1), sgeOf(src, cut2, kBig - cut2)},
                  .remoteAddr = dst.address(4096),
                  .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(wc.byteLen, kBig);
  EXPECT_EQ(soft::sameHostOpsDone(), before + 1);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 43)) << "the bytes before the target";
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 4096, kBig), bytesOf(src)));

  fillPattern(dst.memory.bytes(), 44);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaRead,
                              .wrId = 3,
                              .sges = {sgeOf(src, 0, kBig)},
                              .remoteAddr = dst.address(4096),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(matchesPattern(bytesOf(src), 44, 4096));

  // Eight 1 MiB WRITEs posted together, each to its own place.
  fillPattern(src.memory.bytes(), 45);
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 8; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 10 + i,
                   .sges = {sgeOf(src, i << 20, 1u << 20)},
                   .flags = i == 7 ? v::send_flags::kSignaled : 0u,
                   .remoteAddr = dst.address((7 - i) << 20),
                   .rkey = dst.mr.rkey()});
  }
  before = soft::sameHostOpsDone();
  ASSERT_OK(postAll(pair->a.qp, ops));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.wrId, 17u);
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(soft::sameHostOpsDone(), before + 8);
  for (uint64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(bytesEqual(bytesOf(dst, (7 - i) << 20, 1u << 20), bytesOf(src, i << 20, 1u << 20)))
        << "write " << i;
  }
  EXPECT_EQ(soft::sameHostSplitCopies(), splitBefore + 3) << "each of the three was copied by two threads";
}

// A large run posted together is copied by two threads, split by where its bytes land: requests
// that overlap still land in post order (a later one's bytes over an earlier one's), for WRITEs
// (split by the peer's addresses) and READs (split by ours).
TEST_P(SameHostPath, OverlappingRequestsCopiedByTwoThreadsLandInPostOrder) {
  constexpr size_t kBlock = 1u << 20, kShift = 96 * 1024, kCount = 8;
  constexpr size_t kSpan = kBlock + (kCount - 1) * kShift;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kCount * kBlock, v::access::kLocalWrite, 61));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kSpan, v::access::kAll, 62));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 8)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));  // connected
  for (size_t i = 0; i < kCount; ++i) fillPattern(src.memory.bytes().subspan(i * kBlock, kBlock), 70 + i);
  fillPattern(dst.memory.bytes(), 69);

  // WRITE i puts block i at i * 96 KiB: each overlaps the next seven, the last one wins.
  std::vector<uint8_t> expected(bytesOf(dst).begin(), bytesOf(dst).end());
  std::vector<SendOp> ops;
  for (size_t i = 0; i < kCount; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 10 + i,
                   .sges = {sgeOf(src, i * kBlock, kBlock)},
                   .flags = i + 1 == kCount ? v::send_flags::kSignaled : 0u,
                   .remoteAddr = dst.address(i * kShift),
                   .rkey = dst.mr.rkey()});
    auto block = bytesOf(src, i * kBlock, kBlock);
    std::copy(block.begin(), block.end(), expected.begin() + static_cast<std::ptrdiff_t>(i * kShift));
  }
  uint64_t split = soft::sameHostSplitCopies();
  uint64_t before = soft::sameHostOpsDone();
  ASSERT_OK(postAll(pair->a.qp, ops));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(soft::sameHostOpsDone(), before + kCount);
  EXPECT_EQ(soft::sameHostSplitCopies(), split + 1) << "the run was copied by two threads";
  EXPECT_TRUE(bytesEqual(bytesOf(dst), std::span<const uint8_t>(expected)))
      << "the WRITEs landed out of order";

  // READ i fetches 1 MiB from i * 96 KiB of the peer's into the same local block: the last wins.
  fillPattern(dst.memory.bytes(), 79);
  fillPattern(src.memory.bytes(), 78);
  ops.clear();
  for (size_t i = 0; i < kCount; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaRead,
                   .wrId = 20 + i,
                   .sges = {sgeOf(src, 0, kBlock)},
                   .flags = i + 1 == kCount ? v::send_flags::kSignaled : 0u,
                   .remoteAddr = dst.address(i * kShift),
                   .rkey = dst.mr.rkey()});
  }
  split = soft::sameHostSplitCopies();
  ASSERT_OK(postAll(pair->a.qp, ops));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_EQ(soft::sameHostSplitCopies(), split + 1) << "the run was copied by two threads";
  EXPECT_TRUE(bytesEqual(bytesOf(src, 0, kBlock), bytesOf(dst, (kCount - 1) * kShift, kBlock)))
      << "the READs landed out of order";
  EXPECT_TRUE(matchesPattern(bytesOf(src, kBlock, (kCount - 1) * kBlock), 78, kBlock)) << "beyond the block";
}

// One try of the test below on a fresh pair. *parked: the path was dropped while the run waited
// (false when the progress thread itself needed the memory lock meanwhile, to send or take a
// frame: then the QP could not be moved to ERR until the lock was let go).
void SameHostPath::runWhosePathGoes(bool* parked) {
  constexpr size_t kEach = 12 * 1024;  // each under the 16 KiB held under the lock; the run above it
  *parked = false;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = {.cap = {.maxSendWr = 16,
                                                            .maxRecvWr = 16,
                                                            .maxSendSge = 4,
                                                            .maxRecvSge = 4,
                                                            .maxInlineData = 0}}}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 2 * kEach, v::access::kLocalWrite, 51));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 2 * kEach, v::access::kAll, 52));
  v::WorkCompletion wc;
  for (uint64_t id = 1; id <= 2; ++id) {  // the first may go over TCP while the path comes up
    ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                                .wrId = id,
                                .sges = {sgeOf(src, 0, 8)},
                                .remoteAddr = dst.address(),
                                .rkey = dst.mr.rkey()}));
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    ASSERT_EQ(wc.status, v::WcStatus::kSuccess);
  }
  const uint64_t before = soft::sameHostOpsDone();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 3,
                              .sges = {sgeOf(src, 0, 8)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_EQ(soft::sameHostOpsDone(), before + 1) << "the same-host path is up";
  fillPattern(dst.memory.bytes(), 53);

  auto* requester = dynamic_cast<soft::SoftContext*>(pair->a.context->impl().get());
  ASSERT_NE(requester, nullptr);
  std::vector<SendOp> run;
  for (uint64_t i = 0; i < 2; ++i) {
    run.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 10 + i,
                   .sges = {sgeOf(src, i * kEach, kEach)},
                   .flags = v::send_flags::kSignaled,
                   .remoteAddr = dst.address(i * kEach),
                   .rkey = dst.mr.rkey()});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // what the first WRITEs left is taken
  std::unique_lock<std::shared_mutex> memory(requester->memMu());
  auto posting = std::async(std::launch::async, [&] { return postAll(pair->a.qp, run); });
  // The run has taken the path and waits for the memory lock, without the QP's lock.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(posting.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  v::QpAttr err;
  err.state = v::QpState::kErr;
  auto erred =
      std::async(std::launch::async, [&] { return pair->a.qp.modify(err, v::qp_attr_mask::kState); });
  *parked = erred.wait_for(std::chrono::seconds(5)) == std::future_status::ready;  // the path is dropped
  dst.mr.close();  // and the copy will be refused
  memory.unlock();
  EXPECT_OK(erred.get());
  ASSERT_EQ(posting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_OK(posting.get());
  std::vector<v::WorkCompletion> wcs;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &wcs));
  EXPECT_TRUE(matchesPattern(bytesOf(dst), 53)) << "nothing landed";
  if (!*parked) return;  // the QP moved to ERR after the run went on: it ended some other way
  for (size_t k = 0; k < wcs.size(); ++k) {
    EXPECT_EQ(wcs[k].wrId, 10 + k);
    EXPECT_EQ(wcs[k].status, v::WcStatus::kWrFlushErr) << "request " << k;
  }
  EXPECT_EQ(soft::sameHostOpsDone(), before + 1) << "nothing more took the same-host path";
}

// A run of WRITEs longer than the QP's lock is held for copies without it. If the path goes while
// the copy waits (the QP moved to ERR, as when its peer dies) and the copy then fails (the owner's
// key is gone), the post must not go on with the path it had taken before: the requests are
// flushed, nothing lands. The requester's memory lock, held here, holds the copy at its start
// for as long as the test needs (ASan catches a use of the old path; a plain build may not).
TEST_P(SameHostPath, ARunWhosePathGoesWhileItCopiesIsFlushedNotCarriedOnTheOldPath) {
  bool parked = false;
  for (int attempt = 0; attempt < 3 && !parked; ++attempt) {
    ASSERT_NO_FATAL_FAILURE(runWhosePathGoes(&parked));
  }
  if (!parked) GTEST_SKIP() << "the progress thread needed the memory lock in each of three tries";
}

// FERRY_SOFT_SAME_HOST=0 (the soft_tcp path): the same pair of processes' contexts moves every byte
// over TCP, however often it writes and reads.
class ForcedTcpPath : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    if (providerPath().name != "soft_tcp") GTEST_SKIP() << "the variable is set on the soft_tcp path";
  }
};

TEST_P(ForcedTcpPath, WritesAndReadsNeverTakeTheSameHostPath) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * 1024, v::access::kLocalWrite, 98));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * 1024, v::access::kAll, 99));
  const uint64_t before = soft::sameHostOpsDone();
  for (uint64_t id = 1; id <= 8; ++id) {
    const auto op = id % 2 ? v::WrOpcode::kRdmaWrite : v::WrOpcode::kRdmaRead;
    ASSERT_OK(post(pair->a.qp, {.opcode = op,
                                .wrId = id,
                                .sges = {sgeOf(src, 0, 64 * 1024)},
                                .remoteAddr = dst.address(),
                                .rkey = dst.mr.rkey()}));
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  }
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  EXPECT_EQ(soft::sameHostOpsDone(), before)
      << "a request took the same-host path with FERRY_SOFT_SAME_HOST=0";
}

// Large WRITEs back to back: after the first, each frame's header is read in a small window, and
// its payload straight into place, not a quarter MiB of it into the staging buffer and copied again.
TEST_P(ForcedTcpPath, LargeWritesBackToBackAreReadIntoPlaceNotStaged) {
  constexpr size_t kMiB = 1024 * 1024;
  constexpr uint64_t kWrites = 16;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kWrites * kMiB, v::access::kLocalWrite, 100));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kWrites * kMiB, v::access::kAll, 101));
  const uint64_t before = soft::largePayloadBytesStaged();
  for (uint64_t id = 0; id < kWrites; ++id) {
    ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                                .wrId = id,
                                .sges = {sgeOf(src, id * kMiB, kMiB)},
                                .remoteAddr = dst.address() + id * kMiB,
                                .rkey = dst.mr.rkey()}));
  }
  for (uint64_t id = 0; id < kWrites; ++id) {
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  }
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  // The first frame's header read may bring up to the staging buffer's 256 KiB; each later one a
  // window of 4 KiB. Staged as before, the 16 MiB would bring several MiB.
  EXPECT_LE(soft::largePayloadBytesStaged() - before, 256 * 1024 + kWrites * 4096)
      << "large payloads went through the staging buffer";
}

INSTANTIATE_TEST_SUITE_P(Providers, ForcedTcpPath, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

INSTANTIATE_TEST_SUITE_P(Providers, SameHostPath, ::testing::ValuesIn(providerPaths()), providerPathTestName);

}  // namespace
}  // namespace ferry::test
