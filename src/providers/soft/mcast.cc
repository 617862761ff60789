#include "providers/soft/mcast.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry::soft::mcast {
namespace {

// The user's registry directory (created 0700 when `create`; a send only reads it); refuses one
// that another user owns or others may write.
Result<std::string> baseDir(bool create) {
  std::string dir = "/dev/shm/ferry-mcast-" + std::to_string(::geteuid());
  if (create && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ioError("mkdir " + dir);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ioError("stat " + dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Status(
        StatusCode::kPermissionDenied,
        dir + " is not a private directory of this user: multicast groups are not safe to keep there");
  }
  return dir;
}

std::string groupName(const verbs::Gid& group) {
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", group.raw[i]);
  return hex;
}

std::string memberName(uint32_t pid, in_addr_t ipv4, uint16_t port, uint32_t qpn) {
  char ip[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = ipv4;
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return std::to_string(pid) + "-" + ip + "-" + std::to_string(port) + "-" + std::to_string(qpn);
}

bool parseMember(const char* name, Member* out) {
  unsigned pid = 0, port = 0, qpn = 0;
  char ip[INET_ADDRSTRLEN + 1] = {};
  if (std::sscanf(name, "%u-%16[0-9.]-%u-%u", &pid, ip, &port, &qpn) != 4) return false;
  in_addr a{};
  if (::inet_pton(AF_INET, ip, &a) != 1 || port == 0 || port > 65535 || qpn >= (1u << 24)) return false;
  if (memberName(pid, a.s_addr, static_cast<uint16_t>(port), qpn) != name) return false;  // canonical only
  *out = Member{pid, a.s_addr, static_cast<uint16_t>(port), qpn};
  return true;
}

}  // namespace

Status attach(const verbs::Gid& group, in_addr_t ipv4, uint16_t port, uint32_t qpn) {
  FERRY_ASSIGN_OR_RETURN(std::string base, baseDir(true));
  std::string dir = base + "/" + groupName(group);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ioError("mkdir " + dir);
  std::string path = dir + "/" + memberName(static_cast<uint32_t>(::getpid()), ipv4, port, qpn);
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ioError("attach to a multicast group: create " + path);
  ::close(fd);
  return Status::ok();
}

Status detach(const verbs::Gid& group, in_addr_t ipv4, uint16_t port, uint32_t qpn) {
  FERRY_ASSIGN_OR_RETURN(std::string base, baseDir(false));
  std::string path =
      base + "/" + groupName(group) + "/" + memberName(static_cast<uint32_t>(::getpid()), ipv4, port, qpn);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return invalidArgument("detach: the QP is not attached to that multicast group");
    return ioError("detach from a multicast group: unlink " + path);
  }
  (void)::rmdir((base + "/" + groupName(group)).c_str());  // the last member leaves: the group goes
  return Status::ok();
}

std::vector<Member> members(const verbs::Gid& group) {
  std::vector<Member> out;
  auto base = baseDir(false);
  if (!base.isOk()) return out;
  std::string dir = *base + "/" + groupName(group);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    Member m;
    if (!parseMember(e->d_name, &m)) continue;
    if (::kill(static_cast<pid_t>(m.pid), 0) != 0 && errno == ESRCH) {
      ::unlinkat(::dirfd(d), e->d_name, 0);  // its process is gone
      continue;
    }
    out.push_back(m);
  }
  ::closedir(d);
  return out;
}

}  // namespace ferry::soft::mcast
