//! MLX's distributed layer (`mx.distributed`) through mlx-c: a communication [`Group`] from one
//! of MLX's backends (`ring` over TCP, `mpi`, `nccl` on CUDA, `jaccl` over Thunderbolt RDMA) and
//! its collectives as lazy array ops. Weft has no transport of its own: ranks are configured the
//! way `mlx.launch` configures them (`MLX_RANK`, `MLX_HOSTFILE`, ... read by MLX itself), so
//! `mlx.launch` can start Weft ranks. See docs/distributed.md.

mod raw;

use std::sync::Arc;

use mlx_rs::{Array, Dtype};

use crate::{Error, Result};

/// The backends MLX 0.32 knows, as `mx.distributed.init(backend=...)` spells them; `any` picks
/// the first available.
pub const BACKENDS: [&str; 6] = ["any", "ring", "mpi", "nccl", "jaccl", "jaccl-ring"];

/// Whether MLX was built with `backend` (and, for `any`, whether any backend is).
pub fn is_available(backend: &str) -> Result<bool> {
    let name = backend_name(backend)?;
    Ok(raw::is_available(&name))
}

fn backend_name(backend: &str) -> Result<std::ffi::CString> {
    if !BACKENDS.contains(&backend) {
        return Err(Error::Unsupported(format!(
            "distributed backend {backend:?} (MLX knows {})",
            BACKENDS.join(", ")
        )));
    }
    Ok(std::ffi::CString::new(backend).expect("backend names have no NUL"))
}

/// This process's MLX device as a rank reports it: `cpu` or `gpu`, then MLX's device name when
/// the backend gives one (`device_info`'s `device_name`, e.g. `gpu: NVIDIA H200`).
pub fn device_name() -> String {
    let kind = crate::default_device();
    match raw::default_device_name() {
        Some(name) => format!("{kind}: {}", name.trim()),
        None => kind.to_string(),
    }
}

/// A group of ranks (MLX `mx.distributed.Group`). Cheap to clone; the MLX group is freed with
/// the last clone.
#[derive(Clone)]
pub struct Group {
    raw: Arc<raw::RawGroup>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {})", self.rank, self.size)
    }
}

impl Group {
    /// `mx.distributed.init(strict, backend)`. `strict = false` gives a group of one rank when
    /// the backend is not configured (no hostfile); `strict = true` makes that an error. With
    /// the `ring` backend this blocks until every rank of the hostfile has connected.
    pub fn init(backend: &str, strict: bool) -> Result<Group> {
        let name = backend_name(backend)?;
        if backend != "any" && !raw::is_available(&name) {
            return Err(Error::Unsupported(format!("distributed backend {backend:?} is not available in this MLX build")));
        }
        let raw = raw::init(&name, strict).map_err(|e| Error::Mlx(format!("distributed init ({backend}): {e}")))?;
        let (rank, size) = (raw.rank(), raw.size());
        if size == 0 || rank >= size {
            return Err(Error::Mlx(format!("distributed init ({backend}): rank {rank} of a group of {size}")));
        }
        Ok(Group { raw: Arc::new(raw), rank, size })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// `mx.distributed.all_sum`: the elementwise sum of `x` over every rank, on every rank.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        raw::collective(|res, s| unsafe { mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.raw.get(), s) })
            .map_err(|e| Error::Mlx(format!("all_sum: {e}")))
    }

    /// `mx.distributed.all_gather`: every rank's `x` concatenated along axis 0, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        raw::collective(|res, s| unsafe { mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.raw.get(), s) })
            .map_err(|e| Error::Mlx(format!("all_gather: {e}")))
    }

    /// `mx.distributed.sum_scatter`: the sum over ranks, split along axis 0, this rank's part.
    pub fn sum_scatter(&self, x: &Array) -> Result<Array> {
        raw::collective(|res, s| unsafe { mlx_sys::mlx_distributed_sum_scatter(res, x.as_ptr(), self.raw.get(), s) })
            .map_err(|e| Error::Mlx(format!("sum_scatter: {e}")))
    }

    /// `mx.distributed.send`: sends `x` to rank `dst` when the returned array is evaluated.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        let dst = self.peer(dst, "send")?;
        raw::collective(|res, s| unsafe { mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst, self.raw.get(), s) })
            .map_err(|e| Error::Mlx(format!("send to rank {dst}: {e}")))
    }

    /// `mx.distributed.recv`: an array of `shape` and `dtype` received from rank `src`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array> {
        let src = self.peer(src, "recv")?;
        let dt: u32 = dtype.into();
        raw::collective(|res, s| unsafe {
            mlx_sys::mlx_distributed_recv(res, shape.as_ptr(), shape.len(), dt as _, src, self.raw.get(), s)
        })
        .map_err(|e| Error::Mlx(format!("recv from rank {src}: {e}")))
    }

    /// `mx.distributed.recv_like`: an array shaped and typed as `like`, received from `src`.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        let src = self.peer(src, "recv")?;
        raw::collective(|res, s| unsafe { mlx_sys::mlx_distributed_recv_like(res, like.as_ptr(), src, self.raw.get(), s) })
            .map_err(|e| Error::Mlx(format!("recv from rank {src}: {e}")))
    }

    fn peer(&self, r: usize, what: &str) -> Result<i32> {
        if r >= self.size || r == self.rank {
            return Err(Error::InvalidRequest(format!(
                "{what}: rank {r} is not a peer of rank {} in a group of {}",
                self.rank, self.size
            )));
        }
        Ok(r as i32)
    }
}

