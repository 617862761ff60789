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

template <typename Fn>
struct Wanted {
  const char* name;
  Fn* slot;
};
template <typename Fn>
Wanted(const char*, Fn*) -> Wanted<Fn>;  // spelled out: clang before 17 deduces no aggregate's

// Resolves each of `wanted` in turn: false (and the reason) at the first one missing.
template <typename... Fn>
bool resolveEach(void* library, std::string* reason, Wanted<Fn>... wanted) {
  return (resolve(library, wanted.name, wanted.slot, reason) && ...);
}

// Every function the provider needs (false, and the reason, at the first one missing), then the
// optional ones.
bool resolveAll(void* library, Api* api, std::string* reason) {
  Api& a = *api;
  const bool ok = resolveEach(
      library, reason, Wanted{"ibv_get_device_list", &a.getDeviceList},
      Wanted{"ibv_free_device_list", &a.freeDeviceList}, Wanted{"ibv_get_device_name", &a.getDeviceName},
      Wanted{"ibv_get_device_guid", &a.getDeviceGuid}, Wanted{"ibv_open_device", &a.openDevice},
      Wanted{"ibv_close_device", &a.closeDevice}, Wanted{"ibv_get_async_event", &a.getAsyncEvent},
      Wanted{"ibv_ack_async_event", &a.ackAsyncEvent}, Wanted{"ibv_query_device", &a.queryDevice},
      Wanted{"ibv_query_port", &a.queryPortCompat}, Wanted{"ibv_query_gid", &a.queryGid},
      Wanted{"ibv_alloc_pd", &a.allocPd}, Wanted{"ibv_dealloc_pd", &a.deallocPd},
      Wanted{"ibv_reg_mr", &a.regMr}, Wanted{"ibv_dereg_mr", &a.deregMr},
      Wanted{"ibv_create_comp_channel", &a.createCompChannel},
      Wanted{"ibv_destroy_comp_channel", &a.destroyCompChannel}, Wanted{"ibv_create_cq", &a.createCq},
      Wanted{"ibv_resize_cq", &a.resizeCq}, Wanted{"ibv_destroy_cq", &a.destroyCq},
      Wanted{"ibv_get_cq_event", &a.getCqEvent}, Wanted{"ibv_ack_cq_events", &a.ackCqEvents},
      Wanted{"ibv_create_srq", &a.createSrq}, Wanted{"ibv_modify_srq", &a.modifySrq},
      Wanted{"ibv_query_srq", &a.querySrq}, Wanted{"ibv_destroy_srq", &a.destroySrq},
      Wanted{"ibv_create_qp", &a.createQp}, Wanted{"ibv_modify_qp", &a.modifyQp},
      Wanted{"ibv_query_qp", &a.queryQp}, Wanted{"ibv_destroy_qp", &a.destroyQp},
      Wanted{"ibv_create_ah", &a.createAh}, Wanted{"ibv_destroy_ah", &a.destroyAh},
      Wanted{"ibv_attach_mcast", &a.attachMcast}, Wanted{"ibv_detach_mcast", &a.detachMcast});
  if (!ok) return false;
  std::string absent;  // device memory is then refused with the reason (IbvContext::probeDmaBuf)
  (void)resolve(library, "ibv_reg_dmabuf_mr", &a.regDmabufMr, &absent);
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
  loaded.ok = resolveAll(library, &loaded.api, &loaded.reason);
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
