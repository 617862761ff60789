// Whether a range of this process's memory is mapped with the access a registration asks for.
#pragma once

#include <cstddef>

#include "ferry/common/status.h"

namespace ferry::verbs {

// As ibv_reg_mr pins a range (get_user_pages, for writing when the access allows any write): the
// pages are faulted in with madvise(MADV_POPULATE_WRITE or MADV_POPULATE_READ), which fails for
// memory that is not mapped or not mapped with that access. Contents never change. Kernels without
// those advice values (before 5.14) are checked with mincore(), which finds unmapped pages only.
// kInvalidArgument names the range and what it lacks.
Status checkMapped(const void* addr, size_t length, bool write);

}  // namespace ferry::verbs
