// UD multicast on the software devices: a host-wide registry of group members.
//
// A software device has no switch to replicate packets, so the sender does: attaching a UD QP to
// a group records it under /dev/shm/ferry-mcast-<uid>/<group>/ as an empty file named
// "<pid>-<ipv4>-<port>-<qpn>" (the member's context address and QP number), and a send to the
// group reads that directory and sends one datagram to each member, as the switch of an IB subnet
// would. Every QP of the host attached to the group receives it, in any process of the same user
// (the directory is the user's, mode 0700). A member whose process is gone is skipped and its
// entry removed; detaching, destroying the QP or closing its context removes the entry. The
// sending QP itself does not receive its own send (IB's multicast loopback is blocked for the
// sending QP here).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::soft::mcast {

// A multicast GID: ff00::/8.
inline bool isMulticastGid(const verbs::Gid& gid) { return gid.raw[0] == 0xff; }

struct Member {
  uint32_t pid = 0;
  in_addr_t ipv4 = 0;  // network byte order
  uint16_t port = 0;   // host byte order
  uint32_t qpn = 0;
};

// Records (pid of this process, ipv4, port, qpn) as a member of group (idempotent).
Status attach(const verbs::Gid& group, in_addr_t ipv4, uint16_t port, uint32_t qpn);
// Removes that record; kInvalidArgument when it was not attached.
Status detach(const verbs::Gid& group, in_addr_t ipv4, uint16_t port, uint32_t qpn);
// The live members of group (entries of dead processes are removed on the way).
std::vector<Member> members(const verbs::Gid& group);

}  // namespace ferry::soft::mcast
