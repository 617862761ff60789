// cuObjServer: ferry's object server (spec 003). An application's control path (HTTP, S3, a queue)
// carries a request and the client's opaque RDMA descriptor (cuobj_client.h); the server serves a
// GET by RDMA WRITE of its registered memory into the client's buffer and a PUT by RDMA READ from
// it, on a channel of its own:
//
//   cuObjServer server("127.0.0.1", 18515, CUOBJ_PROTO_RDMA_DC_V1);
//   if (!server.isConnected()) return;                      // the address or the devices failed
//   uint16_t channel = server.allocateChannelId();          // one per thread
//   void* buf = server.allocHostBuffer(1 << 20);
//   rdma_buffer* rb = server.registerBuffer(buf, 1 << 20);
//   ssize_t n = server.handleGetObject("bucket/key", rb, remote_addr, size, descriptor, channel);
//
// How a client is reached (the document's "Dynamically Connected" protocol): the descriptor names
// the client's ferry agent (agent/agent.h) and the keys of the one range it exposes. The server
// runs an agent of its own, listening on ip:port, and connects to a client the first time a
// descriptor names it (wireup in the background of that request; later requests reuse the
// connection). Nothing is set up per client by the application, and a client needs no server
// address. The devices are every one ferry sees (FERRY_DEVICES narrows them); the lanes are the
// agent's (same-host shared memory, an RDMA NIC, TCP).
//
// Return values (as the document lists them): constructors never throw (isConnected() reports);
// registration returns nullptr on failure; handleGetObject()/handlePutObject() return the size
// (synchronous), 0 (asynchronous submission, then poll()), or -ENODEV (no session), -EIO (bad
// argument, descriptor, channel or range, a failed submission or completion), -ENOMEM,
// -EAFNOSUPPORT (the client has no wireup address of the server's address family).
//
// Before a byte moves, the server claims the descriptor from the client agent it names, over the
// connection the wireup made (one round trip on it): the client confirms that it minted exactly
// that text, live, and not used by a request before, and the transfer uses the keys it confirmed.
// So a descriptor serves one request. A descriptor the client refuses (not minted there, edited,
// expired, revoked, replayed) fails with -EIO and status IBV_WC_REM_ACCESS_ERR; a client that does
// not answer within the transport timeout of the tunables (4.096 us * 2^timeout * (retry_cnt + 1),
// 2.1 s by default, at least 100 ms) with -EIO and IBV_WC_RESP_TIMEOUT_ERR. In both cases nothing
// moves. The claim is made inside handleGetObject()/handlePutObject(), asynchronous ones too.
//
// Failures are the request's own: a client that died or revoked its memory costs the requests
// addressed to it (on RC semantics, the ones in flight to that client with it) and nothing else.
//
// Threads: channel allocation is serialized by the server; a channel is used by one thread at a
// time (requests on distinct channels run in parallel). Telemetry (setupTelemetry,
// setTelemFlags) is configured before the first server is constructed.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ferry/objects/cuobj_types.h"

struct rdma_cm_id;
// An opaque handle of a registered buffer (registerBuffer) or of a view (getRDMABufferFromSgList).
struct rdma_buffer;

namespace ferry::objects {
class ServerCore;
}

class RDMAConnection {
 public:
  cuObjRDMATunable params;

  // Stores the address (IPv4 or IPv6 text, no brackets) and port; an invalid address is marked
  // and makes startRDMASession() fail.
  RDMAConnection(const char* ip, unsigned short port);
  RDMAConnection(const RDMAConnection&) = delete;
  RDMAConnection& operator=(const RDMAConnection&) = delete;
  RDMAConnection(RDMAConnection&&) = delete;
  RDMAConnection& operator=(RDMAConnection&&) = delete;
  ~RDMAConnection();

  // Opens the devices and listens on ip:port for the wireup of client connections. 0, or -1 when
  // the address is invalid or not this host's, the port is taken, num_dcis is out of range, or no
  // device opens. Starting an open session again returns 0.
  int startRDMASession();
  // Copies the tunables (read by the next startRDMASession()).
  void initRDMAConfigParams(cuObjRDMATunable config_params);
  // Closes the session: client connections end, requests in flight fail. Idempotent.
  void closeRDMASession();
  // Declared by the document, not an application call: ferry's agent handles disconnects itself.
  // Given the rdma_cm_id of a connection ferry made, it would drop it; ferry makes none, so this
  // only records the event in the debug telemetry.
  void handleDisconnectEvent(struct rdma_cm_id* id);

  // The text address of `id`'s local side; for nullptr, the address this server listens on. The
  // pointer is to static storage of the calling thread, valid until its next call.
  char* getChannelIP(struct rdma_cm_id* id);
  // The source port of `id`'s local side; for nullptr, the port this server listens on.
  int getChannelPort(struct rdma_cm_id* id);
  // Copies the tunables into *param (nothing for nullptr, which is logged).
  void getConfigTunableParam(struct cuObjRDMATunableParam* param);

 protected:
  RDMAConnection();
  std::shared_ptr<ferry::objects::ServerCore> core_;
};

class cuObjServer : public RDMAConnection {
 public:
  cuObjServer(const char* ip, unsigned short port, unsigned proto);
  cuObjServer(const char* ip, unsigned short port, unsigned proto, cuObjRDMATunable params);
  // Not connected (isConnected() is false; every call fails as without a device).
  cuObjServer() = default;
  ~cuObjServer();

  // Page-aligned host memory of `size` bytes (release with free()); nullptr for 0 or no memory.
  void* allocHostBuffer(size_t size);
  // Registers host memory with every device of the session. nullptr without a session, for a
  // null pointer, a size of 0, or memory the devices refuse (unmapped, for instance).
  struct rdma_buffer* registerBuffer(void* ptr, size_t size);
  // A scatter-gather list of 1..10 entries, each non-null and non-empty; nullptr otherwise.
  struct rdma_buffer* registerBuffer(std::vector<cuObjScatterGatherEntry_t> sglist);
  // A view of (offset, size) pieces of a single-entry registered buffer; nullptr when sglist is
  // empty, the buffer is null, not registered here, a view, or has several entries, or when the
  // pieces add up to more than the buffer. A piece that lies outside the buffer is refused too
  // (ferry checks every offset, not only the sum).
  struct rdma_buffer* getRDMABufferFromSgList(struct rdma_buffer* rdma_buffer,
                                              std::vector<cuObjScatterGatherEntryWithOffset_t> sglist);
  // Releases a view (an error is logged for nullptr or a buffer that is not a view).
  void putRDMABufferFromSgList(struct rdma_buffer* rdma_buffer);
  // Deregisters a buffer of registerBuffer() (nullptr: nothing). Its views stop working.
  void deRegisterBuffer(struct rdma_buffer* rdma_buff);

  // GET: RDMA WRITE of `size` bytes of local_rdma_buff (from local_offset) to the client's
  // [remote_buf_start, +size), which must lie in the range rdma_descr grants for GET. See the top
  // of this file for the return values; `status` receives the completion status of a synchronous
  // request that reached the transport. With async_handle, returns 0 once submitted: poll() the
  // same channel. poll_delay: nanoseconds between checks of a synchronous wait (cuObjDelayMode_t).
  ssize_t handleGetObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                          uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                          uint32_t poll_delay, uint16_t channel = 0, uint64_t local_offset = 0,
                          ibv_wc_status* status = nullptr, void* async_handle = nullptr);
  ssize_t handleGetObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                          uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                          uint16_t channel = 0, uint64_t local_offset = 0, ibv_wc_status* status = nullptr,
                          void* async_handle = nullptr);
  // PUT: RDMA READ of the client's range into local_rdma_buff; as handleGetObject() otherwise.
  ssize_t handlePutObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                          uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                          uint32_t poll_delay, uint16_t channel = 0, uint64_t local_offset = 0,
                          ibv_wc_status* status = nullptr, void* async_handle = nullptr);
  ssize_t handlePutObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                          uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                          uint16_t channel = 0, uint64_t local_offset = 0, ibv_wc_status* status = nullptr,
                          void* async_handle = nullptr);

  // Up to min(max_events, 16) completions of the channel's asynchronous requests, in submission
  // order among those done: their count (0: none yet), -ENODEV without a session, -EINVAL for a
  // null events, a negative max_events, or a channel not allocated, -EIO when one of them failed
  // (the events before and including it are filled; the return is then not a count).
  int poll(cuObjAsyncEvent_t* events, int max_events, uint16_t channel = 0);

  bool isConnected();
  // The lowest free channel in 0..num_dcis-1, or INVALID_CHANNEL_ID.
  uint16_t allocateChannelId();
  // Frees a channel (ids >= num_dcis, or free ones: nothing). Requests still outstanding on it
  // are waited for first, so their memory is no longer touched when this returns.
  void freeChannelId(uint16_t channel_id);

  // Telemetry of the servers created after the call: one line per event on `os` (use_OTEL asks
  // for OpenTelemetry, which this build does not include: the stream is used). Each line:
  // "<UTC time> cuobj <LEVEL> pid=<pid> key=<request key> op=GET size=... channel=... ...".
  static void setupTelemetry(bool use_OTEL, std::ostream* os);
  // Back to the default stream (std::cerr); call before closing a stream given to setupTelemetry.
  static void shutdownTelemetry();
  // CUOBJ_LOG_PATH_INFO | CUOBJ_LOG_PATH_DEBUG | CUOBJ_LOG_PATH_ERROR (default: ERROR), applied
  // when the telemetry of the next first server is created.
  static void setTelemFlags(unsigned flags);
};
