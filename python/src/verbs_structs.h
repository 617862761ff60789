// The verbs structures that cross the Python boundary on every work request: sge, send_wr,
// recv_wr and wc (ferry.verbs.sge, ...). They are C++ values with named, typed fields, so posting
// and polling do not go through Python attribute dictionaries, and assigning a value of the wrong
// type or range raises TypeError at once.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace ferry::python {

namespace py = pybind11;

// ibv_sge: `length` bytes at `addr`, inside the region with key `lkey`.
struct SgeValue {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// ibv_send_wr, flattened the way the verbs specification's Python binding does it: the RDMA,
// atomic and UD members sit next to each other; which apply depends on the opcode and QP type.
struct SendWrValue {
  uint64_t wr_id = 0;
  py::object sg_list = py::none();  // an sge, a list/tuple of sge, or None
  int opcode = 0;                   // IBV_WR_* (0 is IBV_WR_RDMA_WRITE, as in a zeroed ibv_send_wr)
  uint32_t send_flags = 0;
  uint32_t imm_data = 0;
  uint64_t remote_addr = 0;  // RDMA and atomic operations
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // atomics
  uint64_t swap = 0;
  py::object ah = py::none();  // UD: a ferry.verbs.AH
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
};

// ibv_recv_wr.
struct RecvWrValue {
  uint64_t wr_id = 0;
  py::object sg_list = py::none();
};

// ibv_wc.
struct WcValue {
  uint64_t wr_id = 0;
  int status = 0;
  int opcode = 0;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint32_t pkey_index = 0;
  uint32_t slid = 0;
  uint32_t sl = 0;
  uint32_t dlid_path_bits = 0;
};

}  // namespace ferry::python
