#include "providers/ibverbs/loader.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <mutex>

#include "ferry/common/config.h"

namespace ferry::ibverbs {
namespace {

struct Loaded {
  Api api;
  bool ok = false;
  std::string reason;
};

// Resolves `name` into *slot; false (and the reason) when the library lacks it.
template <typename Fn>
bool resolve(void* library, const char* name, Fn* slot, std::string* reason) {
  dlerror();
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    const char* error = dlerror();
    *reason = std::string("libibverbs lacks ") + name + (error ? std::string(": ") + error : std::string());
    return false;
  }
  *slot = reinterpret_cast<Fn>(symbol);
  return true;
}

Loaded load() {
  Loaded loaded;
  const std::string path = config::ibverbsLibrary();
  // Never closed: contexts and their provider libraries live as long as the process.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.reason =
        "cannot load " + path + " (install rdma-core's libibverbs1): " + (error ? error : "dlopen failed");
    return loaded;
  }
  Api& a = loaded.api;
  std::string& r = loaded.reason;
  const bool ok = resolve(library, "ibv_get_device_list", &a.getDeviceList, &r) &&
                  resolve(library, "ibv_free_device_list", &a.freeDeviceList, &r) &&
                  resolve(library, "ibv_get_device_name", &a.getDeviceName, &r) &&
                  resolve(library, "ibv_get_device_guid", &a.getDeviceGuid, &r) &&
                  resolve(library, "ibv_open_device", &a.openDevice, &r) &&
                  resolve(library, "ibv_close_device", &a.closeDevice, &r) &&
                  resolve(library, "ibv_get_async_event", &a.getAsyncEvent, &r) &&
                  resolve(library, "ibv_ack_async_event", &a.ackAsyncEvent, &r) &&
                  resolve(library, "ibv_query_device", &a.queryDevice, &r) &&
                  resolve(library, "ibv_query_port", &a.queryPortCompat, &r) &&
                  resolve(library, "ibv_query_gid", &a.queryGid, &r) &&
                  resolve(library, "ibv_alloc_pd", &a.allocPd, &r) &&
                  resolve(library, "ibv_dealloc_pd", &a.deallocPd, &r) &&
                  resolve(library, "ibv_reg_mr", &a.regMr, &r) &&
                  resolve(library, "ibv_dereg_mr", &a.deregMr, &r) &&
                  resolve(library, "ibv_create_comp_channel", &a.createCompChannel, &r) &&
                  resolve(library, "ibv_destroy_comp_channel", &a.destroyCompChannel, &r) &&
                  resolve(library, "ibv_create_cq", &a.createCq, &r) &&
                  resolve(library, "ibv_resize_cq", &a.resizeCq, &r) &&
                  resolve(library, "ibv_destroy_cq", &a.destroyCq, &r) &&
                  resolve(library, "ibv_get_cq_event", &a.getCqEvent, &r) &&
                  resolve(library, "ibv_ack_cq_events", &a.ackCqEvents, &r) &&
                  resolve(library, "ibv_create_srq", &a.createSrq, &r) &&
                  resolve(library, "ibv_modify_srq", &a.modifySrq, &r) &&
                  resolve(library, "ibv_query_srq", &a.querySrq, &r) &&
                  resolve(library, "ibv_destroy_srq", &a.destroySrq, &r) &&
                  resolve(library, "ibv_create_qp", &a.createQp, &r) &&
                  resolve(library, "ibv_modify_qp", &a.modifyQp, &r) &&
                  resolve(library, "ibv_query_qp", &a.queryQp, &r) &&
                  resolve(library, "ibv_destroy_qp", &a.destroyQp, &r) &&
                  resolve(library, "ibv_create_ah", &a.createAh, &r) &&
                  resolve(library, "ibv_destroy_ah", &a.destroyAh, &r) &&
                  resolve(library, "ibv_attach_mcast", &a.attachMcast, &r) &&
                  resolve(library, "ibv_detach_mcast", &a.detachMcast, &r);
  loaded.ok = ok;
  return loaded;
}

}  // namespace

int Api::queryPort(ibv_context* context, uint8_t portNum, ibv_port_attr* attr) const {
  *attr = ibv_port_attr{};
  // What verbs_get_ctx_op(context, query_port) does, without its statement expression.
  verbs_context* extended = verbs_get_ctx(context);
  if (extended != nullptr && extended->sz >= sizeof(*extended) - offsetof(verbs_context, query_port) &&
      extended->query_port != nullptr) {
    return extended->query_port(context, portNum, attr, sizeof(*attr));
  }
  return queryPortCompat(context, portNum, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

const Api* loadApi(std::string* reason) {
  static const Loaded kLoaded = load();
  if (!kLoaded.ok) {
    if (reason != nullptr) *reason = kLoaded.reason;
    return nullptr;
  }
  return &kLoaded.api;
}

int errnoOf(int rc) {
  if (rc > 0) return rc;
  return errno != 0 ? errno : EIO;
}

Status verbsError(const std::string& what, int err) {
  StatusCode code = StatusCode::kIoError;
  switch (err) {
    case EINVAL: code = StatusCode::kInvalidArgument; break;
    case ENOMEM:
    case ENOSPC:
    case EAGAIN:
    case EMFILE:
    case ENFILE: code = StatusCode::kResourceExhausted; break;
    case EOPNOTSUPP:
    case ENOSYS:
    case EPROTONOSUPPORT: code = StatusCode::kNotSupported; break;
    case ENOENT:
    case ENODEV:
    case ENXIO: code = StatusCode::kNotFound; break;
    case EACCES:
    case EPERM: code = StatusCode::kPermissionDenied; break;
    case ETIMEDOUT: code = StatusCode::kTimedOut; break;
    case EBUSY: code = StatusCode::kBusy; break;
    default: break;
  }
  return Status(code, what, err);
}

}  // namespace ferry::ibverbs
