// The object server's core (cuObjServer, include/ferry/cuobj_server.h), shared by its files:
// server.cc (the public classes over it), server_core.cc (the session, buffers, channels and the
// clients' connections) and server_requests.cc (a request from its checks to its completion).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"
#include "common/json.h"
#include "ferry/agent/agent.h"
#include "ferry/cuobj_server.h"
#include "ferry/devices.h"
#include "objects/descriptor.h"
#include "objects/telemetry.h"

// One piece of a registered buffer or view: a span of a region the server's agent registered.
struct ObjectPiece {
  uint64_t addr = 0;
  uint64_t size = 0;
  std::string region;  // the agent's region holding it
  uint64_t regionOffset = 0;
};

struct rdma_buffer {
  bool view = false;
  rdma_buffer* base = nullptr;  // a view's registered buffer
  std::vector<ObjectPiece> pieces;
  uint64_t total = 0;
  uint32_t views = 0;  // views of a registered buffer still out
};

namespace ferry::objects {

namespace ep = ferry::endpoint;
namespace ag = ferry::agent;

inline constexpr size_t kMaxSgEntries = 10;
inline constexpr int kPollCap = 16;

// A completion status for a failed operation: the work completion's own when it has one.
ibv_wc_status wcOf(const Status& st);

inline const char* opName(cuObjOpType_t op) { return op == CUOBJ_GET ? "GET" : "PUT"; }

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  struct Pending {
    ep::Future future;
    void* handle = nullptr;
    std::shared_ptr<ep::Endpoint> endpoint;
    ep::MrHandle remote = 0;
    std::string key;
    cuObjOpType_t op = CUOBJ_GET;
    size_t size = 0;
    std::string client;  // the client's address bytes
    int64_t startUs = 0;
  };
  struct Channel {
    std::mutex mu;
    bool allocated = false;
    std::deque<Pending> pending;
  };
  struct Client {
    std::shared_ptr<ag::PeerConnection> conn;
    std::list<std::string>::iterator lru;
    uint32_t inflight = 0;
  };

  ServerCore(const char* ip, unsigned short port) : port_(port) {
    if (ip != nullptr) {
      ip_ = ip;
      in6_addr a6{};
      in_addr a4{};
      if (inet_pton(AF_INET, ip, &a4) == 1) {
        valid_ = true;
      } else if (inet_pton(AF_INET6, ip, &a6) == 1) {
        valid_ = true;
        ipv6_ = true;
      }
    }
  }
  ~ServerCore() { close(); }

  int start(const cuObjRDMATunable& params, const std::shared_ptr<Telemetry>& telem);

  void close();

  bool connected() const { return connected_; }
  const std::string& ip() const { return ip_; }
  int port() const { return connected_ ? boundPort_ : port_; }
  cuObjRDMATunable& params() { return params_; }
  const std::shared_ptr<Telemetry>& telem() const { return telem_; }

  void log(unsigned flag, const std::string& key, const std::string& text);

  // ---- buffers ----
  rdma_buffer* registerPieces(const std::vector<std::pair<void*, size_t>>& entries);

  bool isBuffer(rdma_buffer* b);

  rdma_buffer* view(rdma_buffer* base, const std::vector<cuObjScatterGatherEntryWithOffset_t>& sg);

  void putView(rdma_buffer* v);

  void deregister(rdma_buffer* b);

  // ---- channels ----
  uint16_t allocate();

  void free(uint16_t id);

  Channel* channel(uint16_t id);

  // ---- requests ----
  ssize_t request(cuObjOpType_t op, const std::string& key, rdma_buffer* buf, uint64_t remoteStart,
                  size_t size, const std::string& descr, uint32_t pollDelay, uint16_t channelId,
                  uint64_t localOffset, ibv_wc_status* status, void* asyncHandle);

  int poll(cuObjAsyncEvent_t* events, int maxEvents, uint16_t channelId);

 private:
  // start()'s steps: the session's agent (its wireup deadline and the clients' grant timeout set
  // from the tunables' transport timeout), and the fewest QPs and READ/atomic depth of its devices.
  ag::AgentOptions agentOptions(const cuObjRDMATunableParam& p);
  std::pair<int, int> deviceLimits() const;

  // One request as the caller made it (checkRequest may take localOffset as 0).
  struct RequestCall {
    cuObjOpType_t op;
    const std::string& key;
    rdma_buffer* buf;
    uint64_t remoteStart;
    size_t size;
    const std::string& descr;
    uint32_t pollDelay;
    uint16_t channelId;
    uint64_t localOffset;
    ibv_wc_status* status;
    void* asyncHandle;
  };
  // What checkRequest resolved: the channel, the buffer's pieces, the descriptor and its client.
  struct CheckedRequest {
    Channel* ch = nullptr;
    std::vector<ObjectPiece> pieces;
    Descriptor d;
    ag::WorkerAddress address;
  };
  // The client's connection a request moves its bytes on.
  struct ClientRoute {
    std::shared_ptr<ag::PeerConnection> peer;
    std::shared_ptr<ep::Endpoint> endpoint;
    ag::LaneSet lanes;
  };

  // Logs why a request was refused and returns rc.
  ssize_t refuse(const RequestCall& c, ssize_t rc, const std::string& why);

  // The checks a request passes before any connection: the session, the channel, the sizes, the
  // local buffer, then the descriptor. A refusal's return code, or nothing when it passed.
  std::optional<ssize_t> checkRequest(RequestCall& c, CheckedRequest& req);

  // The local pieces, resolved under the buffer lock (a buffer may be deregistered meanwhile).
  std::optional<ssize_t> resolvePieces(RequestCall& c, CheckedRequest& req);

  // The descriptor: it decodes, grants this operation, has not expired, covers the remote range,
  // and names a client reachable over this server's address family.
  std::optional<ssize_t> checkDescriptor(const RequestCall& c, CheckedRequest& req);

  // The client's connection, ready, with a live endpoint and lanes; a refusal's return code when
  // none could be had before the connect timeout.
  std::optional<ssize_t> connectClient(const RequestCall& c, const CheckedRequest& req, ClientRoute& route);

  // Registers the granted range, with the key of the client's device on the RMA lane, as a remote
  // region of the endpoint (writable for a GET).
  std::optional<ssize_t> registerGrant(const RequestCall& c, const CheckedRequest& req,
                                       const ClientRoute& route, const Descriptor& granted,
                                       ep::MrHandle& remote);

  // The batch: one assignment per local piece the request's range touches, from localOffset on,
  // against consecutive offsets of the remote region.
  std::optional<ssize_t> assembleBatch(const RequestCall& c, const CheckedRequest& req,
                                       const ClientRoute& route, const Descriptor& granted,
                                       ep::MrHandle remote, std::vector<ep::Assignment>& batch);

  // Posts the batch (WRITE for a GET, READ for a PUT): an asynchronous request is queued on its
  // channel, a synchronous one waited for. The request's answer, or nothing when the connection
  // ended between the check and the post and the request should go once more on a new one.
  std::optional<ssize_t> submit(const RequestCall& c, const CheckedRequest& req, const ClientRoute& route,
                                ep::MrHandle remote, const std::vector<ep::Assignment>& batch, int attempt);

  // A claim sent to a client, waiting for its answer.
  struct Claim {
    std::string peerUuid;  // the client the claim went to: only its answer counts
    bool answered = false;
    GrantAnswer answer;
    std::condition_variable cv;
  };

  // Claims the descriptor `text` (decoded: d) from the client agent it names, on that client's
  // connection: the client's own copy of it, which equals d. kPermissionDenied when the client
  // refused (not minted there, edited, revoked, expired, used already) or granted something else;
  // kTimedOut when no answer came within grantTimeout_; kPeerGone when the claim was not sent.
  ferry::Result<Descriptor> claim(const std::shared_ptr<ag::PeerConnection>& peer,
                                  const std::string& peerUuid, const std::string& text, const Descriptor& d);

  // An answer to a claim, on the agent's thread. One from another peer than the claim went to, or
  // to a claim no longer waited for (it timed out), is dropped.
  void onAnswer(const std::shared_ptr<ag::PeerConnection>& from, std::string_view body);

  bool isWildcard() const { return ip_ == "0.0.0.0" || ip_ == "::"; }

  // Waits for a synchronous request as the delay mode says.
  Status waitFor(const ep::Future& f, uint32_t delayNs, size_t entries);

  // Ends a request: forgets the remote range, releases the client, logs, resets on failure.
  ibv_wc_status finish(Pending& p, const Status& st, uint16_t channelId);

  static const char* ibv_wc_status_name(ibv_wc_status wc) {
    static const char* names[] = {
        "SUCCESS",          "LOC_LEN_ERR",       "LOC_QP_OP_ERR",     "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",     "WR_FLUSH_ERR",      "MW_BIND_ERR",       "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",   "REM_INV_REQ_ERR",   "REM_ACCESS_ERR",    "REM_OP_ERR",
        "RETRY_EXC_ERR",    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",  "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",    "INV_EECN_ERR",      "INV_EEC_STATE_ERR", "FATAL_ERR",
        "RESP_TIMEOUT_ERR", "GENERAL_ERR"};
    int i = static_cast<int>(wc);
    return i >= 0 && i <= IBV_WC_GENERAL_ERR ? names[i] : "UNKNOWN";
  }

  // Whether the endpoint of a connection that was wired up has ended since (failed or shut down).
  static bool endpointEnded(const std::shared_ptr<ep::Endpoint>& endpoint) {
    return !endpoint || endpoint->isShutdown() || !endpoint->failure().isOk();
  }

  // The connection to the client of `address`, counted as in use until releaseClient(). At most
  // num_dcis clients are kept: the least recently used idle one is closed to make room.
  ferry::Result<std::shared_ptr<ag::PeerConnection>> clientFor(const std::string& address,
                                                               const std::string& key);

  void releaseClient(const std::string& address);

  // Forgets a client's connection (it failed): the next request connects anew.
  void dropClient(const std::string& address, const std::shared_ptr<ag::PeerConnection>& conn);

  std::string ip_;
  uint16_t port_ = 0;
  uint16_t boundPort_ = 0;
  bool valid_ = false;
  bool ipv6_ = false;
  std::mutex sessionMu_;
  std::atomic<bool> connected_{false};
  cuObjRDMATunable params_;
  std::shared_ptr<Telemetry> telem_;
  std::shared_ptr<ag::Agent> agent_;
  std::chrono::milliseconds connectTimeout_{10000};
  std::chrono::milliseconds grantTimeout_{2000};

  std::mutex grantMu_;
  std::unordered_map<uint64_t, std::shared_ptr<Claim>> claims_;  // by claim id
  std::atomic<uint64_t> nextClaim_{0};

  std::mutex bufMu_;
  std::unordered_set<rdma_buffer*> buffers_;
  std::atomic<uint64_t> nextRegion_{0};
  std::atomic<uint64_t> nextRequest_{0};

  std::mutex chanMu_;
  std::vector<std::unique_ptr<Channel>> channels_;

  std::mutex clientMu_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, Client> clients_;
};

}  // namespace ferry::objects
