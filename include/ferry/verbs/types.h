// Value types of ferry's verbs layer: constants, attributes, work requests and completions.
//
// Numbers follow libibverbs (enum values, flag bits, attribute-mask bits), so code written against
// ibverbs reads the same here and the ibverbs provider passes them through unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace ferry::verbs {

// ---- Access flags of a memory region and of a QP (ibv_access_flags) ----
namespace access {
inline constexpr uint32_t kLocalWrite = 1;
inline constexpr uint32_t kRemoteWrite = 2;
inline constexpr uint32_t kRemoteRead = 4;
inline constexpr uint32_t kRemoteAtomic = 8;
inline constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
}  // namespace access

// ---- Send flags of a work request (ibv_send_flags) ----
namespace send_flags {
inline constexpr uint32_t kFence = 1;
inline constexpr uint32_t kSignaled = 2;
inline constexpr uint32_t kSolicited = 4;
inline constexpr uint32_t kInline = 8;
}  // namespace send_flags

// ---- Completion flags (ibv_wc_flags) ----
namespace wc_flags {
inline constexpr uint32_t kGrh = 1;
inline constexpr uint32_t kWithImm = 2;
}  // namespace wc_flags

// ---- QP attribute mask bits (ibv_qp_attr_mask) ----
namespace qp_attr_mask {
inline constexpr uint32_t kState = 1 << 0;
inline constexpr uint32_t kCurState = 1 << 1;
inline constexpr uint32_t kEnSqdAsyncNotify = 1 << 2;
inline constexpr uint32_t kAccessFlags = 1 << 3;
inline constexpr uint32_t kPkeyIndex = 1 << 4;
inline constexpr uint32_t kPort = 1 << 5;
inline constexpr uint32_t kQkey = 1 << 6;
inline constexpr uint32_t kAv = 1 << 7;
inline constexpr uint32_t kPathMtu = 1 << 8;
inline constexpr uint32_t kTimeout = 1 << 9;
inline constexpr uint32_t kRetryCnt = 1 << 10;
inline constexpr uint32_t kRnrRetry = 1 << 11;
inline constexpr uint32_t kRqPsn = 1 << 12;
inline constexpr uint32_t kMaxQpRdAtomic = 1 << 13;
inline constexpr uint32_t kAltPath = 1 << 14;
inline constexpr uint32_t kMinRnrTimer = 1 << 15;
inline constexpr uint32_t kSqPsn = 1 << 16;
inline constexpr uint32_t kMaxDestRdAtomic = 1 << 17;
inline constexpr uint32_t kPathMigState = 1 << 18;
inline constexpr uint32_t kCap = 1 << 19;
inline constexpr uint32_t kDestQpn = 1 << 20;
}  // namespace qp_attr_mask

// ---- Re-registration flags (ibv_rereg_mr_flags) ----
namespace rereg {
inline constexpr uint32_t kChangeTranslation = 1;
inline constexpr uint32_t kChangePd = 2;
inline constexpr uint32_t kChangeAccess = 4;
}  // namespace rereg

enum class QpState : uint8_t { kReset = 0, kInit = 1, kRtr = 2, kRts = 3, kSqd = 4, kSqe = 5, kErr = 6 };
enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4 };

enum class WrOpcode : uint8_t {
  kRdmaWrite = 0,
  kRdmaWriteWithImm = 1,
  kSend = 2,
  kSendWithImm = 3,
  kRdmaRead = 4,
  kAtomicCmpAndSwp = 5,
  kAtomicFetchAndAdd = 6,
};

// The opcode classes the posting rules and the providers tell apart.
inline bool isAtomic(WrOpcode op) {
  return op == WrOpcode::kAtomicCmpAndSwp || op == WrOpcode::kAtomicFetchAndAdd;
}
// Requests whose responder sends data back (into the requester's memory): READ and the atomics.
inline bool isReadOrAtomic(WrOpcode op) { return op == WrOpcode::kRdmaRead || isAtomic(op); }

enum class WcOpcode : uint8_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};

enum class WcStatus : uint8_t {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocEecOpErr = 3,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kMwBindErr = 6,
  kBadRespErr = 7,
  kLocAccessErr = 8,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kLocRddViolErr = 14,
  kRemInvRdReqErr = 15,
  kRemAbortErr = 16,
  kInvEecnErr = 17,
  kInvEecStateErr = 18,
  kFatalErr = 19,
  kRespTimeoutErr = 20,
  kGeneralErr = 21,
};

// Path MTU codes (ibv_mtu): 1 = 256 ... 5 = 4096.
enum class Mtu : uint8_t { k256 = 1, k512 = 2, k1024 = 3, k2048 = 4, k4096 = 5 };
inline constexpr uint32_t mtuBytes(Mtu mtu) { return 128u << static_cast<uint8_t>(mtu); }

enum class PortState : uint8_t { kNop = 0, kDown = 1, kInit = 2, kArmed = 3, kActive = 4 };
enum class LinkLayer : uint8_t { kUnspecified = 0, kInfiniband = 1, kEthernet = 2 };

enum class AsyncEventType : uint8_t {
  kCqErr = 0,
  kQpFatal = 1,
  kQpReqErr = 2,
  kQpAccessErr = 3,
  kCommEst = 4,
  kSqDrained = 5,
  kPathMig = 6,
  kPathMigErr = 7,
  kDeviceFatal = 8,
  kPortActive = 9,
  kPortErr = 10,
  kLidChange = 11,
  kPkeyChange = 12,
  kSmChange = 13,
  kSrqErr = 14,
  kSrqLimitReached = 15,
  kQpLastWqeReached = 16,
  kClientReregister = 17,
  kGidChange = 18,
};

// Names as libibverbs prints them ("IBV_WC_REM_ACCESS_ERR" style without the prefix).
const char* wcStatusName(WcStatus status);  // e.g. "REM_ACCESS_ERR"
const char* wcOpcodeName(WcOpcode opcode);  // e.g. "RDMA_WRITE"
const char* qpStateName(QpState state);     // e.g. "RTS"
const char* asyncEventName(AsyncEventType type);

// A 128-bit global identifier. For RoCE v2 and ferry's software devices over IPv4 the last four
// bytes hold the IPv4 address (an IPv4-mapped IPv6 address).
struct Gid {
  std::array<uint8_t, 16> raw{};
  bool operator==(const Gid&) const = default;
  bool isZero() const;
  // "fe80:0000:0000:0000:0202:c9ff:fe00:0001" style (8 groups of 4 hex digits).
  std::string toString() const;
  // Accepts the 8-group form above and the usual compressed IPv6 forms ("::ffff:127.0.0.1").
  static bool parse(const std::string& text, Gid* out);
};

struct DeviceAttr {
  std::string fwVer;
  uint64_t nodeGuid = 0;
  uint64_t sysImageGuid = 0;
  uint64_t maxMrSize = 0;
  uint64_t pageSizeCap = 0;
  uint32_t vendorId = 0;
  uint32_t vendorPartId = 0;
  uint32_t hwVer = 0;
  int maxQp = 0;
  int maxQpWr = 0;
  uint32_t deviceCapFlags = 0;
  int maxSge = 0;
  int maxSgeRd = 0;
  int maxCq = 0;
  int maxCqe = 0;
  int maxMr = 0;
  int maxPd = 0;
  int maxQpRdAtom = 0;      // outstanding READ/atomic a QP may have as responder
  int maxQpInitRdAtom = 0;  // outstanding READ/atomic a QP may issue as requester
  int maxSrq = 0;
  int maxSrqWr = 0;
  int maxSrqSge = 0;
  uint16_t maxPkeys = 0;
  uint8_t physPortCnt = 0;
  uint32_t maxInlineData = 0;   // largest inline payload a send WR may carry
  uint8_t atomicCap = 0;        // 0 none, 1 HCA (atomic w.r.t. this device), 2 global
  uint8_t localCaAckDelay = 0;  // how soon the device acknowledges, as an IBA timer code (4.096 us * 2^n)
};

struct PortAttr {
  PortState state = PortState::kNop;
  Mtu maxMtu = Mtu::k4096;
  Mtu activeMtu = Mtu::k4096;
  int gidTblLen = 0;
  uint32_t portCapFlags = 0;
  uint32_t maxMsgSz = 0;
  uint16_t lid = 0;
  uint16_t smLid = 0;
  uint16_t pkeyTblLen = 1;
  LinkLayer linkLayer = LinkLayer::kUnspecified;
  uint8_t activeSpeed = 0;
  uint8_t activeWidth = 0;
};

// Address vector (ibv_ah_attr with its GRH).
struct AhAttr {
  Gid dgid;
  uint32_t flowLabel = 0;
  uint8_t sgidIndex = 0;
  uint8_t hopLimit = 64;
  uint8_t trafficClass = 0;
  bool isGlobal = true;
  uint16_t dlid = 0;
  uint8_t sl = 0;
  uint8_t srcPathBits = 0;
  uint8_t staticRate = 0;
  uint8_t portNum = 1;
};

struct QpCap {
  uint32_t maxSendWr = 0;
  uint32_t maxRecvWr = 0;
  uint32_t maxSendSge = 1;
  uint32_t maxRecvSge = 1;
  uint32_t maxInlineData = 0;
};

// Attributes of ibv_modify_qp / ibv_query_qp; which ones apply is said by a qp_attr_mask.
struct QpAttr {
  QpState state = QpState::kReset;
  QpState curState = QpState::kReset;
  Mtu pathMtu = Mtu::k1024;
  uint32_t qkey = 0;
  uint32_t rqPsn = 0;
  uint32_t sqPsn = 0;
  uint32_t destQpNum = 0;
  uint32_t qpAccessFlags = 0;
  QpCap cap;
  AhAttr ahAttr;
  uint16_t pkeyIndex = 0;
  uint8_t maxRdAtomic = 0;
  uint8_t maxDestRdAtomic = 0;
  uint8_t minRnrTimer = 0;  // code 0..31 (table of 10 us .. 655 ms; 0 means 655.36 ms)
  uint8_t portNum = 0;
  uint8_t timeout = 0;   // 4.096 us * 2^timeout per try; 0 means wait forever
  uint8_t retryCnt = 0;  // 0..7
  uint8_t rnrRetry = 0;  // 0..7; 7 retries forever
  bool sqDraining = false;
};

// One scatter/gather element: `length` bytes at `addr`, inside the region with key `lkey`.
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// A send-queue work request (ibv_send_wr). The SGE list is read during postSend() only.
struct SendWr {
  uint64_t wrId = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t sendFlags = 0;
  std::span<const Sge> sgList;
  // Opaque 32 bits, delivered unchanged in the receiver's completion.
  uint32_t immData = 0;
  struct Rdma {
    uint64_t remoteAddr = 0;
    uint32_t rkey = 0;
  } rdma;
  struct Atomic {
    uint64_t remoteAddr = 0;
    uint64_t compareAdd = 0;  // compare value (CAS) or addend (FAA)
    uint64_t swap = 0;
    uint32_t rkey = 0;
  } atomic;
  // UD QPs only: where the datagram goes.
  struct Ud {
    const void* ah = nullptr;  // AddressHandle::id() of an address handle of the QP's PD
    uint32_t remoteQpn = 0;
    uint32_t remoteQkey = 0;
  } ud;
};

// A receive-queue work request (ibv_recv_wr).
struct RecvWr {
  uint64_t wrId = 0;
  std::span<const Sge> sgList;
};

// A work completion (ibv_wc).
struct WorkCompletion {
  uint64_t wrId = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendorErr = 0;
  uint32_t byteLen = 0;
  uint32_t immData = 0;
  uint32_t qpNum = 0;
  uint32_t srcQp = 0;
  uint32_t wcFlags = 0;
  uint16_t pkeyIndex = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;
  uint8_t dlidPathBits = 0;
};

struct AsyncEvent {
  AsyncEventType type = AsyncEventType::kCqErr;
  uint32_t qpNum = 0;           // for QP events
  const void* cqId = nullptr;   // for CQ events: CompletionQueue::id()
  const void* srqId = nullptr;  // for SRQ events: SharedReceiveQueue::id()
  uint8_t portNum = 0;          // for port events
};

// What listDevices() reports of one device.
struct DeviceInfo {
  std::string name;       // "soft_lo", "mlx5_0", "rxe0"
  std::string provider;   // "soft", "ibverbs"
  std::string transport;  // "tcp", "InfiniBand", "RoCE", ...
  std::string netdev;     // the network interface it is bound to, if any
  std::string address;    // its IP address, if any
  uint64_t guid = 0;
  int numaNode = -1;  // -1 where unknown

  // What the device is, for the layers above to ask rather than name its provider:
  //
  // Peers reach each verbs context of the device at `address` and a port of that context's own:
  // a context has one GID (index 0, the IPv4-mapped `address` with the context's port in it), and
  // LIDs and the GID table mean nothing (ferry's software devices). False: a port's GID table and
  // LIDs address it, as on a NIC.
  bool addressedByContext = false;
  // Its ports, when known without opening it; 0: ask a context (DeviceAttr::physPortCnt).
  int ports = 0;
  // How it moves CUDA device memory, "" where it cannot (registering such memory is then refused,
  // naming why): "staged" copies it through host buffers of the device's own, a piece at a time,
  // as each message goes out or lands (the software devices); "dma-buf" registers it with the NIC,
  // which reads and writes it in place (GPUDirect RDMA; the CUDA driver must export the memory as
  // a dma-buf); "peer-memory" registers device pointers with ibv_reg_mr, which the NVIDIA peer
  // memory module (nvidia_peermem) resolves, on a NIC or kernel without dma-bufs. docs/gpu.md.
  std::string deviceMemory;
};

}  // namespace ferry::verbs
