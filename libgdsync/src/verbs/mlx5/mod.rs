//! The mlx5 direct provider (`GDS_PROVIDER=mlx5`, mlx5 devices only): QPs and CQs created with
//! plain rdma-core verbs, their rings described by `mlx5dv_init_obj` (libmlx5.so.1, dlopen), the
//! data path of [`crate::verbs::mlx5::dv`] on that memory (spec §7.4/§7.5):
//! * sends: the CPU writes WQEs into `sq.buf` at our own producer counter (rdma-core's
//!   `ibv_post_send` would ring the doorbell itself); the request's ops store the doorbell record
//!   and the first ctrl qword to the BlueFlame register (registered as I/O memory) from the stream;
//! * waits: poll of the CQE ownership word in `cq.buf` (registered host memory) + release of a
//!   busy flag; the CPU keeps polling with `ibv_poll_cq` (libmlx5 consumes the CQE: consumer index,
//!   doorbell record, scatter-to-CQE copies), through the same `ctx->ops.poll_cq` hook as the proxy,
//!   which holds back CQEs whose wait has not run, replaces send `wr_id`s from our own table
//!   (libmlx5's is filled only by its own post_send) and rewrites consumed `op_own` to 0xF0 so a
//!   later-lap GEQ wait cannot fire on a stale entry.
//!
//! The files follow rdma-core's mlx5 provider: `ffi` (the `mlx5dv.h` layouts and functions, raw
//! ring access), `sq` (the post path, and how a QP reset is noticed on it), `cq` (waits, the
//! poll hook's side, and how a CQ clean is followed), `qp` (create/destroy and the QP table);
//! [`dv`] is the ring logic they share, with no call into any library.
//!
//! Limits: RC/UC only (a UD WQE needs the mlx5 address vector of an AH), no `SEND_WITH_INV`/
//! `LOCAL_INV`/`TSO`, GEQ waits on even laps (NOR would need the ring's owner bits preset).
//! **Never run on hardware**: no mlx5 NIC is reachable from our test machines. The WQE/CQE logic is
//! unit-tested on synthetic rings (`mlx5dv`); this glue is compiled and reviewed only, which is why
//! it is opt-in and the default for every device is the CPU proxy.

pub mod dv;

mod cq;
mod ffi;
mod qp;
mod sq;

pub(crate) use cq::poll_claim;
pub use cq::{abort_wait, owns_cq, prepare_wait};
pub use qp::{after_cpu_send, create, destroy, owns_qp, post_recv, prepare_send, rollback};
