// The types the object server (cuobj_server.h) and its client (cuobj_client.h) share, with the
// names, values and layouts of the object server document (spec 003), in the global namespace so
// that code written for that document compiles unchanged.
//
// ibv_wc_status (completion statuses) is libibverbs' own enum: <infiniband/verbs.h> from
// libibverbs-dev. rdma_cm_id is librdmacm's (<rdma/rdma_cma.h>, librdmacm-dev); ferry never creates
// one, it only accepts the type where the document's RDMAConnection does.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

typedef enum cuObjErr_enum { CU_OBJ_SUCCESS = 0, CU_OBJ_FAIL = 1 } cuObjErr_t;

// CUOBJ_PROTO_RDMA_DC_V1 is the one protocol; other values are accepted and treated as it.
typedef enum cuObjProto_enum { CUOBJ_PROTO_RDMA_DC_V1 = 1001, CUOBJ_PROTO_MAX } cuObjProto_t;

// GET: the server writes the client's memory; PUT: the server reads it.
typedef enum cuObjOpType_enum { CUOBJ_GET = 0, CUOBJ_PUT = 1, CUOBJ_INVALID = 9999 } cuObjOpType_t;

typedef enum cuObjChannelIdState_enum {
  CHANNEL_ID_FREE = 0,
  CHANNEL_ID_ALLOCATED = 1,
  CHANNEL_ID_IN_USE = 2,
  INVALID_CHANNEL_ID = UINT16_MAX
} cuObjChannelIdState_t;

// How a synchronous handleGetObject()/handlePutObject() waits for its completion (the delay is
// the call's poll_delay, else params.getDelayInterval(), in nanoseconds):
//   NONE      checks without pausing (lowest latency, one core busy while it waits);
//   BATCH     pauses `delay` between checks of the whole request (the default);
//   ENTRY     pauses `delay` per scatter-gather entry of the local buffer between checks;
//   ADAPTIVE  checks without pausing for `delay`, then pauses 1 us, doubling up to `delay`.
// INVALID (or any other value) is taken as BATCH.
typedef enum cuObjDelayMode {
  CUOBJ_DELAY_NONE = 0,
  CUOBJ_DELAY_BATCH = 1,
  CUOBJ_DELAY_ENTRY = 2,
  CUOBJ_DELAY_ADAPTIVE = 3,
  CUOBJ_DELAY_INVALID = 4
} cuObjDelayMode_t;

// Telemetry flags (cuObjServer::setTelemFlags, cuObjClient::setTelemFlags).
#define CUOBJ_LOG_PATH_INFO 0x0001u
#define CUOBJ_LOG_PATH_DEBUG 0x0002u
#define CUOBJ_LOG_PATH_ERROR 0x0004u

// The largest handleGetObject()/handlePutObject() (and client callback) transfer: 1 GiB.
#define CUOBJ_MAX_REQUEST_SIZE (size_t{1} << 30)

typedef struct cuObjScatterGatherEntry {
  void* addr;
  size_t size;
} cuObjScatterGatherEntry_t;

typedef struct cuObjScatterGatherEntryWithOffset {
  loff_t offset;
  size_t size;
} cuObjScatterGatherEntryWithOffset_t;

// One completion of an asynchronous request: its handle, and an ibv_wc_status in `status`.
typedef struct cuObjAsyncEvent_s {
  void* async_handle;
  ssize_t status;
} cuObjAsyncEvent_t;

struct cuObjRDMATunableParam {
  int num_dcis;
  unsigned cq_depth;
  unsigned long dc_key;
  int ibv_poll_max_comp_event;
  int service_level;
  uint8_t timeout;
  unsigned hop_limit;
  int pkey_index;
  int max_wr;
  int max_sge;
  uint32_t delay_interval;
  cuObjDelayMode_t delay_mode;
  bool qp_reset_on_failure;
  uint8_t retry_cnt;
  unsigned traffic_class;
  int max_rd_atomic;
};

// The server's tunables with the document's defaults. Setters store what they are given (no
// range checks, as documented); the server reads them when its session starts:
//   num_dcis            channels (ids 0..num_dcis-1); 1..65535 and at most the device's QPs,
//                       else the session does not start. Also the most client connections the
//                       server keeps open at once (the least recently used one is closed first).
//   cq_depth            asynchronous requests a channel may have outstanding (more: -EIO).
//   timeout, retry_cnt  the connection's transport timeout, 4.096 us * 2^timeout per try, retry_cnt
//                       + 1 tries: how long a request to an unresponsive client may take, and the
//                       wireup deadline to a client (at least 10 s either way).
//   max_sge             the most entries a registered buffer may have for a request (-EIO above).
//   delay_interval, delay_mode   how synchronous requests wait (cuObjDelayMode_t).
//   qp_reset_on_failure after a failed completion, the connection to that client is dropped at
//                       once and the next request connects anew (false: it is kept until the
//                       transport itself retires it).
//   traffic_class       below 256: the traffic class of RoCE packets; 256 and above: logged as
//                       invalid and not applied.
//   max_rd_atomic       0: the device's maximum; positive: capped to it (read back after start).
//   dc_key, service_level, hop_limit, pkey_index: stored and reported; ibv_poll_max_comp_event,
//   max_wr: not used (as documented).
class cuObjRDMATunable {
 public:
  cuObjRDMATunable();

  void setNumDcis(int v) { p_.num_dcis = v; }
  int getNumDcis() const { return p_.num_dcis; }
  void setCqDepth(unsigned v) { p_.cq_depth = v; }
  unsigned getCqDepth() const { return p_.cq_depth; }
  void setDcKey(unsigned long v) { p_.dc_key = v; }
  unsigned long getDcKey() const { return p_.dc_key; }
  void setIbvPollMaxCompEv(int v) { p_.ibv_poll_max_comp_event = v; }
  int getIbvPollMaxCompEv() const { return p_.ibv_poll_max_comp_event; }
  void setServiceLevel(int v) { p_.service_level = v; }
  int getServiceLevel() const { return p_.service_level; }
  void setTimeout(uint8_t v) { p_.timeout = v; }
  uint8_t getTimeout() const { return p_.timeout; }
  void setHopLimit(unsigned v) { p_.hop_limit = v; }
  unsigned getHopLimit() const { return p_.hop_limit; }
  void setPkeyIndex(int v) { p_.pkey_index = v; }
  int getPkeyIndex() const { return p_.pkey_index; }
  void setMaxWr(int v) { p_.max_wr = v; }
  int getMaxWr() const { return p_.max_wr; }
  void setMaxSge(int v) { p_.max_sge = v; }
  int getMaxSge() const { return p_.max_sge; }
  void setDelayInterval(uint32_t v) { p_.delay_interval = v; }
  uint32_t getDelayInterval() const { return p_.delay_interval; }
  void setDelayMode(cuObjDelayMode_t v) { p_.delay_mode = v; }
  cuObjDelayMode_t getDelayMode() const { return p_.delay_mode; }
  void setQPResetOnFailure(bool v) { p_.qp_reset_on_failure = v; }
  bool getQPResetOnFailure() const { return p_.qp_reset_on_failure; }
  void setRetryCount(uint8_t v) { p_.retry_cnt = v; }
  uint8_t getRetryCount() const { return p_.retry_cnt; }
  // Values of 256 and above are logged as invalid and leave the traffic class as it was.
  void setTrafficClass(unsigned v);
  unsigned getTrafficClass() const { return p_.traffic_class; }
  void setMaxRdAtomic(uint8_t v) { p_.max_rd_atomic = v; }
  int getMaxRdAtomic() const { return p_.max_rd_atomic; }

  // All of them at once.
  const cuObjRDMATunableParam& values() const { return p_; }
  cuObjRDMATunableParam& values() { return p_; }

 private:
  cuObjRDMATunableParam p_;
};
