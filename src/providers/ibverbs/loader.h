// libibverbs, loaded at run time.
//
// ferry links no RDMA library: the ibverbs provider opens libibverbs.so.1 with dlopen() on first
// use and resolves the exported functions it calls with dlsym(). A host without rdma-core still
// builds, runs and tests ferry; the provider then reports itself unavailable with the reason.
//
// The data-path functions of <infiniband/verbs.h> (ibv_post_send, ibv_post_recv,
// ibv_post_srq_recv, ibv_poll_cq, ibv_req_notify_cq) are static inline and call through the
// context's operation table, which the provider library filled in; they need no symbol and work
// on a context opened through this table. Everything else goes through Api.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "ferry/common/status.h"

namespace ferry::ibverbs {

struct Api {
  ibv_device** (*getDeviceList)(int* numDevices) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* device) = nullptr;
  __be64 (*getDeviceGuid)(ibv_device* device) = nullptr;
  ibv_context* (*openDevice)(ibv_device* device) = nullptr;
  int (*closeDevice)(ibv_context* context) = nullptr;
  int (*getAsyncEvent)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ackAsyncEvent)(ibv_async_event* event) = nullptr;
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // The compatibility entry point; queryPort() below prefers the context's own operation.
  int (*queryPortCompat)(ibv_context* context, uint8_t portNum, _compat_ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* context, uint8_t portNum, int index, ibv_gid* gid) = nullptr;
  ibv_pd* (*allocPd)(ibv_context* context) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;
  // Optional (rdma-core 34 and later): a region over a dma-buf, for GPUDirect RDMA.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) = nullptr;
  ibv_comp_channel* (*createCompChannel)(ibv_context* context) = nullptr;
  int (*destroyCompChannel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*resizeCq)(ibv_cq* cq, int cqe) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  int (*getCqEvent)(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext) = nullptr;
  void (*ackCqEvents)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_srq* (*createSrq)(ibv_pd* pd, ibv_srq_init_attr* init) = nullptr;
  int (*modifySrq)(ibv_srq* srq, ibv_srq_attr* attr, int mask) = nullptr;
  int (*querySrq)(ibv_srq* srq, ibv_srq_attr* attr) = nullptr;
  int (*destroySrq)(ibv_srq* srq) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* init) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*queryQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;
  ibv_ah* (*createAh)(ibv_pd* pd, ibv_ah_attr* attr) = nullptr;
  int (*destroyAh)(ibv_ah* ah) = nullptr;
  int (*attachMcast)(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) = nullptr;
  int (*detachMcast)(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) = nullptr;

  // ibv_query_port: the provider's query_port operation when it has one (the full, current
  // ibv_port_attr), else the compatibility entry point.
  int queryPort(ibv_context* context, uint8_t portNum, ibv_port_attr* attr) const;
};

// The table, loaded once per process from FERRY_IBVERBS_LIBRARY (default "libibverbs.so.1").
// nullptr when the library or one of its functions is missing; *reason then says which.
const Api* loadApi(std::string* reason);

// The errno a failed libibverbs call left: calls return it (> 0), or return -1 / NULL and set
// errno. Never 0 for a failure.
int errnoOf(int rc);

// A refused libibverbs call as a Status: the errno becomes the cause and picks the code
// (EINVAL -> kInvalidArgument, ENOMEM -> kResourceExhausted, EOPNOTSUPP -> kNotSupported, ...).
Status verbsError(const std::string& what, int err);

}  // namespace ferry::ibverbs
