// cuObjClient: the client side of ferry's object server (cuobj_server.h), with the names of the
// client library that pairs with spec 003's server. The client exposes its memory to a server one
// range at a time through descriptors; the application's control path carries them:
//
//   ssize_t my_get(const void* handle, char* ptr, size_t size, loff_t offset,
//                  const cufileRDMAInfo_t* info) {
//     // send "GET <key> offset size" with info->desc_str and (uint64_t)ptr to the server, whose
//     // handleGetObject(key, buf, (uint64_t)ptr, size, info->desc_str, ...) writes the bytes;
//     return size;                                      // bytes the server placed
//   }
//   CUObjOps_t ops{.get = my_get, .put = my_put};
//   cuObjClient client(ops);
//   client.cuMemObjGetDescriptor(buf, len);             // register once
//   ssize_t n = client.cuObjGet(my_ctx, buf, len);      // calls my_get per chunk (<= 1 GiB)
//   client.cuMemObjPutDescriptor(buf);
//
// The descriptor (cufileRDMAInfo_t::desc_str, or the token of cuMemObjGetRDMAToken) is
// self-contained text: this client's agent address, the byte range, the one direction it allows
// (GET: the server may WRITE the range; PUT: it may READ it), its expiry, and keys that only grant
// that range in that direction (a registration of just that range, made for the token). The client
// enforces it at access time, on its own device: an access outside the range, in the other
// direction, after the expiry, or after the token was put back (the callback returned,
// cuMemObjPutRDMAToken, cuMemObjPutDescriptor) fails at the server with IBV_WC_REM_ACCESS_ERR and
// the memory is untouched. The server's remote_buf_start is the address of the range's first byte
// in this process (the callback's ptr; ptr + buffer_offset for a token).
//
// One descriptor, one request: before the server moves a byte it claims the descriptor from this
// client's agent (docs/objects.md, "How a descriptor works"), which confirms only a descriptor it
// minted, live and never claimed before, and answers with its own copy, whose keys the server uses. A second
// request with the same descriptor, or one with an edited descriptor, fails at the server with -EIO and
// nothing moves. The client answers on its agent's thread; a client that cannot answer (stopped)
// fails the server's request after the server's wait.
//
// The token lifetime is FERRY_OBJECTS_TOKEN_TTL seconds (default 300). Threads: every method may be
// called from any thread; callbacks run on the calling thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>

#include "ferry/objects/cuobj_types.h"

typedef struct cufileRDMAInfo {
  int version;           // 1
  int desc_len;          // strlen(desc_str) + 1
  const char* desc_str;  // the descriptor
} cufileRDMAInfo_t;

// The application's control path: send the request with rdma_info->desc_str to the server and
// return the bytes it moved (a short count ends the transfer; a negative value fails it).
typedef struct CUObjIOOps {
  ssize_t (*get)(const void* handle, char* ptr, size_t size, loff_t offset,
                 const cufileRDMAInfo_t* rdma_info);
  ssize_t (*put)(const void* handle, const char* ptr, size_t size, loff_t offset,
                 const cufileRDMAInfo_t* rdma_info);
} CUObjOps_t;

namespace ferry::objects {
class ClientCore;
}

class cuObjClient {
 public:
  // Starts the client's agent (devices: FERRY_DEVICES, else every one). Never throws:
  // isConnected() reports.
  cuObjClient(CUObjOps_t& ops, cuObjProto_t proto = CUOBJ_PROTO_RDMA_DC_V1);
  cuObjClient(const cuObjClient&) = delete;
  cuObjClient& operator=(const cuObjClient&) = delete;
  // Revokes every token and registration, then stops the agent.
  ~cuObjClient();

  bool isConnected();

  // Registers [ptr, +size) for requests (no remote access of its own: only tokens grant that).
  // CU_OBJ_FAIL without a session, for nullptr, 0, memory registered already or unmapped.
  cuObjErr_t cuMemObjGetDescriptor(void* ptr, size_t size);
  // Revokes every token inside the registration at ptr, then deregisters it. CU_OBJ_FAIL when ptr
  // starts no registration.
  cuObjErr_t cuMemObjPutDescriptor(void* ptr);
  // The largest piece one callback carries for the registration at (or containing) ptr: its size,
  // at most 1 GiB; -EINVAL when ptr is in no registration.
  ssize_t cuMemObjGetMaxRequestCallbackSize(void* ptr);

  // Moves `size` bytes of the object from `offset` into (cuObjGet) or out of (cuObjPut)
  // [ptr + buf_offset, +size), which must lie in a registration: ops.get / ops.put are called per
  // piece of at most cuMemObjGetMaxRequestCallbackSize(ptr) bytes, with a token for exactly that
  // piece and direction, revoked when the callback returns. Returns the bytes moved (less than
  // size when a callback returned a short count), or a negative errno value: -EINVAL for a bad
  // range or no session, or what a callback returned.
  ssize_t cuObjGet(void* ctx, void* ptr, size_t size, loff_t offset = 0, loff_t buf_offset = 0);
  ssize_t cuObjPut(void* ctx, void* ptr, size_t size, loff_t offset = 0, loff_t buf_offset = 0);
  // The ctx of the cuObjGet()/cuObjPut() whose callback received `handle` (nullptr otherwise).
  static void* getCtx(const void* handle);

  // A token for [ptr + buffer_offset, +size) of registered memory and one direction, as a
  // malloc'ed string in *desc_str: valid until cuMemObjPutRDMAToken(desc_str), the registration's
  // cuMemObjPutDescriptor(), or its expiry. CU_OBJ_FAIL for a range outside a registration, an op
  // other than CUOBJ_GET/CUOBJ_PUT, a null desc_str, size 0 or above 1 GiB.
  cuObjErr_t cuMemObjGetRDMAToken(void* ptr, size_t size, size_t buffer_offset, cuObjOpType_t op,
                                  char** desc_str);
  // Revokes the token and frees desc_str. CU_OBJ_FAIL (nothing freed) for a string that is not a
  // live token of this client.
  cuObjErr_t cuMemObjPutRDMAToken(char* desc_str);

  // The same telemetry as cuObjServer's (one sink for both).
  static void setupTelemetry(bool use_OTEL, std::ostream* os);
  static void shutdownTelemetry();
  static void setTelemFlags(unsigned flags);

 private:
  ssize_t transfer(cuObjOpType_t op, void* ctx, void* ptr, size_t size, loff_t offset, loff_t bufOffset);
  CUObjOps_t ops_;
  std::shared_ptr<ferry::objects::ClientCore> core_;
};
