//! The unsafe edge: mlx-c's distributed calls, their status codes and MLX's error messages.
//!
//! mlx-c reports a failure through one process-global error handler (its default one prints
//! and exits). mlx-rs registers a handler that stashes the message for mlx-rs's own wrappers,
//! which are private to it; so before the first call here, mlx-rs's handler is made to be
//! registered and then wrapped by one that keeps the message of a call made here and hands
//! every other one on unchanged, so mlx-rs sees its own errors exactly as before.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Once;

use mlx_rs::{Array, Stream};

extern "C" {
    /// mlx-rs's handler (`#[no_mangle]` in mlx-rs `error.rs`).
    fn default_mlx_error_handler(msg: *const c_char, data: *mut c_void);
}

thread_local! {
    /// `Some` while this thread is inside a call made here: the message of its failure.
    static LAST_ERROR: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

extern "C" fn keep_and_forward(msg: *const c_char, data: *mut c_void) {
    let ours = LAST_ERROR.with(|e| match e.borrow_mut().as_mut() {
        Some(slot) => {
            // SAFETY: mlx-c passes a NUL-terminated message valid for this call.
            *slot = Some(if msg.is_null() { String::new() } else { unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned() });
            true
        }
        None => false,
    });
    if !ours {
        // SAFETY: the arguments are exactly those mlx-c gave us.
        unsafe { default_mlx_error_handler(msg, data) }
    }
}

/// Runs `f` (one mlx-c call returning a status) with its error message captured.
fn captured<T>(f: impl FnOnce() -> (i32, T)) -> (i32, T, Option<String>) {
    ensure_handler();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(None));
    let (status, out) = f();
    let msg = LAST_ERROR.with(|e| e.borrow_mut().take()).flatten();
    (status, out, msg)
}

fn ensure_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Any fallible mlx-rs op registers mlx-rs's handler (once per process); ours must come
        // after it or mlx-rs would replace it.
        let _ = Array::from_int(0).add(Array::from_int(0));
        // SAFETY: a plain function pointer with no data to free.
        unsafe { mlx_sys::mlx_set_error_handler(Some(keep_and_forward), std::ptr::null_mut(), None) };
    });
}

fn message(status: i32, msg: Option<String>) -> String {
    msg.unwrap_or_else(|| format!("MLX returned status {status} without a message"))
}

/// An initialised `mlx_distributed_group`; freed on drop.
pub(super) struct RawGroup(mlx_sys::mlx_distributed_group);

// SAFETY: an MLX group is an immutable handle to a communicator that MLX itself uses from its
// worker threads; Weft never mutates it after init.
unsafe impl Send for RawGroup {}
unsafe impl Sync for RawGroup {}

impl RawGroup {
    pub(super) fn get(&self) -> mlx_sys::mlx_distributed_group {
        self.0
    }

    pub(super) fn rank(&self) -> usize {
        // SAFETY: a group initialised by `init`.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.0) }.max(0) as usize
    }

    pub(super) fn size(&self) -> usize {
        // SAFETY: as above.
        unsafe { mlx_sys::mlx_distributed_group_size(self.0) }.max(0) as usize
    }
}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: freed once, here.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.0);
        }
    }
}

pub(super) fn is_available(backend: &CString) -> bool {
    ensure_handler();
    // SAFETY: a NUL-terminated name.
    unsafe { mlx_sys::mlx_distributed_is_available(backend.as_ptr()) }
}

pub(super) fn init(backend: &CString, strict: bool) -> Result<RawGroup, String> {
    // SAFETY: a fresh empty group that init fills; freed on every path.
    let (status, group, msg) = captured(|| unsafe {
        let mut group = mlx_sys::mlx_distributed_group_new();
        (mlx_sys::mlx_distributed_init(&mut group, strict, backend.as_ptr()), group)
    });
    if status != 0 || group.ctx.is_null() {
        unsafe { mlx_sys::mlx_distributed_group_free(group) };
        return Err(message(status, msg));
    }
    Ok(RawGroup(group))
}

/// Runs one mlx-c op that writes an array into `res` on this thread's default stream.
pub(super) fn collective(op: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array, String> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh array the op sets on success and we free on failure.
    let (status, res, msg) = captured(|| unsafe {
        let mut res = mlx_sys::mlx_array_new();
        (op(&mut res, stream.as_ptr()), res)
    });
    if status != 0 {
        unsafe { mlx_sys::mlx_array_free(res) };
        return Err(message(status, msg));
    }
    // SAFETY: set by the successful op; owned from here on.
    Ok(unsafe { Array::from_ptr(res) })
}

/// MLX's `device_info(default_device())["device_name"]`, when the backend names its device.
pub(super) fn default_device_name() -> Option<String> {
    const KEY: &CStr = c"device_name";
    // SAFETY: a fresh device and info object, filled by mlx-c and freed on every path; the
    // name is copied out before the info object that owns it is freed.
    let (_, name, _) = captured(|| unsafe {
        let mut dev = mlx_sys::mlx_device_new();
        let mut info = mlx_sys::mlx_device_info_new();
        let mut name = None;
        let mut status = mlx_sys::mlx_get_default_device(&mut dev);
        if status == 0 {
            status = mlx_sys::mlx_device_info_get(&mut info, dev);
        }
        let (mut exists, mut is_string) = (false, false);
        if status == 0
            && mlx_sys::mlx_device_info_has_key(&mut exists, info, KEY.as_ptr()) == 0
            && exists
            && mlx_sys::mlx_device_info_is_string(&mut is_string, info, KEY.as_ptr()) == 0
            && is_string
        {
            let mut p: *const c_char = std::ptr::null();
            if mlx_sys::mlx_device_info_get_string(&mut p, info, KEY.as_ptr()) == 0 && !p.is_null() {
                name = Some(CStr::from_ptr(p).to_string_lossy().into_owned());
            }
        }
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(dev);
        (status, name)
    });
    name.filter(|n| !n.trim().is_empty())
}
