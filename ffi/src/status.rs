//! Status codes, the per-thread last-error message and the guard every `extern "C"` function
//! runs its body in (no panic crosses the boundary).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status codes returned by the int32_t functions: WEFT_OK (0) or a negative error. The enum
/// only names the values; functions return int32_t so that codes added later stay ABI-stable.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_status {
    /// Success.
    WEFT_OK = 0,
    /// A NULL pointer, malformed JSON, invalid UTF-8, an unknown field, a bad field value, or a
    /// call made where it is not allowed (e.g. from inside an event callback).
    WEFT_ERR_INVALID_ARGUMENT = -1,
    /// The model could not be found, read, downloaded or parsed.
    WEFT_ERR_MODEL_LOAD = -2,
    /// No such object, e.g. a request id this engine never issued.
    WEFT_ERR_NOT_FOUND = -3,
    /// Not enough room: a caller buffer too small, or a request larger than the engine's whole
    /// KV budget.
    WEFT_ERR_CAPACITY = -4,
    /// The engine has been shut down (weft_engine_shutdown).
    WEFT_ERR_SHUTDOWN = -5,
    /// A bug or a failure inside the engine or MLX (including a caught Rust panic).
    WEFT_ERR_INTERNAL = -6,
    /// The model is well formed but uses an architecture or option this engine does not
    /// implement.
    WEFT_ERR_UNSUPPORTED = -7,
    /// The engine's thread failed (a bug): every outstanding request got an ERROR event and the
    /// engine takes no more requests. Free it and create a new one.
    WEFT_ERR_ENGINE_FAILED = -8,
    /// (ABI minor 2) The caller cancelled the call: a weft_progress_fn returned non-zero during
    /// the model's download.
    WEFT_ERR_CANCELLED = -9,
}

pub(crate) const WEFT_OK: i32 = weft_status::WEFT_OK as i32;
pub(crate) const WEFT_ERR_INVALID_ARGUMENT: i32 = weft_status::WEFT_ERR_INVALID_ARGUMENT as i32;
pub(crate) const WEFT_ERR_MODEL_LOAD: i32 = weft_status::WEFT_ERR_MODEL_LOAD as i32;
pub(crate) const WEFT_ERR_NOT_FOUND: i32 = weft_status::WEFT_ERR_NOT_FOUND as i32;
pub(crate) const WEFT_ERR_CAPACITY: i32 = weft_status::WEFT_ERR_CAPACITY as i32;
pub(crate) const WEFT_ERR_SHUTDOWN: i32 = weft_status::WEFT_ERR_SHUTDOWN as i32;
pub(crate) const WEFT_ERR_INTERNAL: i32 = weft_status::WEFT_ERR_INTERNAL as i32;
pub(crate) const WEFT_ERR_UNSUPPORTED: i32 = weft_status::WEFT_ERR_UNSUPPORTED as i32;
pub(crate) const WEFT_ERR_ENGINE_FAILED: i32 = weft_status::WEFT_ERR_ENGINE_FAILED as i32;
pub(crate) const WEFT_ERR_CANCELLED: i32 = weft_status::WEFT_ERR_CANCELLED as i32;

pub(crate) fn status_str(status: i32) -> &'static CStr {
    match status {
        WEFT_OK => c"ok",
        WEFT_ERR_INVALID_ARGUMENT => c"invalid argument",
        WEFT_ERR_MODEL_LOAD => c"model load failed",
        WEFT_ERR_NOT_FOUND => c"not found",
        WEFT_ERR_CAPACITY => c"capacity exceeded",
        WEFT_ERR_SHUTDOWN => c"engine shut down",
        WEFT_ERR_INTERNAL => c"internal error",
        WEFT_ERR_UNSUPPORTED => c"unsupported model",
        WEFT_ERR_ENGINE_FAILED => c"engine failed",
        WEFT_ERR_CANCELLED => c"cancelled",
        _ => c"unknown status",
    }
}

/// A failed call: its status code and the message `weft_last_error` returns.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: i32,
    pub message: String,
}

impl Failure {
    pub fn new(status: i32, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(WEFT_ERR_INVALID_ARGUMENT, message)
    }
}

pub(crate) type FfiResult<T> = Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(message: &str) {
    // Interior NULs would truncate the C string; the message is for people, so replace them.
    let c = CString::new(message.replace('\0', "\u{FFFD}")).unwrap_or_default();
    // `try_with`: during thread teardown the slot may be gone; then there is nowhere to write.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
}

pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.try_with(|slot| slot.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs an `extern "C"` function's body: a `Failure` becomes its status code and this thread's
/// last-error message; a panic becomes `WEFT_ERR_INTERNAL`.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> FfiResult<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => WEFT_OK,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(payload) => {
            set_last_error(&format!("{name}: internal error (Rust panic: {})", panic_message(&*payload)));
            WEFT_ERR_INTERNAL
        }
    }
}

/// Maps an engine error to a status code. `loading`: the error came from opening a model, where
/// tokenizer and MLX failures mean the model files are at fault.
pub(crate) fn from_engine_error(e: &weft::Error, loading: bool) -> Failure {
    let code = if loading { e.load_code() } else { e.code() };
    Failure::new(status_of(code), e.to_string())
}

/// The C status of each of the engine's error codes.
pub(crate) fn status_of(code: weft::ErrorCode) -> i32 {
    use weft::ErrorCode as C;
    match code {
        C::InvalidArgument => WEFT_ERR_INVALID_ARGUMENT,
        C::ModelLoad => WEFT_ERR_MODEL_LOAD,
        C::Unsupported => WEFT_ERR_UNSUPPORTED,
        C::Capacity => WEFT_ERR_CAPACITY,
        C::EngineClosed => WEFT_ERR_SHUTDOWN,
        C::EngineFailed => WEFT_ERR_ENGINE_FAILED,
        C::Internal | C::GenerationFailed => WEFT_ERR_INTERNAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_failures_and_panics_into_codes_and_messages() {
        assert_eq!(guard("f", || Ok(())), WEFT_OK);
        assert_eq!(guard("f", || Err(Failure::new(WEFT_ERR_NOT_FOUND, "no such id"))), WEFT_ERR_NOT_FOUND);
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string();
        assert_eq!(msg, "no such id");
        assert_eq!(guard("f", || panic!("boom")), WEFT_ERR_INTERNAL);
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string();
        assert!(msg.contains("f: internal error") && msg.contains("boom"), "{msg}");
        // Success leaves the last message in place (errno-style).
        assert_eq!(guard("f", || Ok(())), WEFT_OK);
        assert!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_bytes().ends_with(b"boom)"));
        // Interior NULs do not truncate the message.
        set_last_error("a\0b");
        assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap(), "a\u{FFFD}b");
    }

    #[test]
    fn engine_errors_map_to_codes() {
        use weft::Error as E;
        let code = |e: E, loading| from_engine_error(&e, loading).status;
        assert_eq!(code(E::ModelLoad("x".into()), true), WEFT_ERR_MODEL_LOAD);
        assert_eq!(code(E::Download("x".into()), true), WEFT_ERR_MODEL_LOAD);
        assert_eq!(code(E::Unsupported("x".into()), true), WEFT_ERR_UNSUPPORTED);
        assert_eq!(code(E::Tokenizer("x".into()), true), WEFT_ERR_MODEL_LOAD);
        assert_eq!(code(E::Tokenizer("x".into()), false), WEFT_ERR_INVALID_ARGUMENT);
        assert_eq!(code(E::Mlx("x".into()), false), WEFT_ERR_INTERNAL);
        assert_eq!(code(E::InvalidRequest("the prompt is empty".into()), false), WEFT_ERR_INVALID_ARGUMENT);
        assert_eq!(code(E::Shutdown, false), WEFT_ERR_SHUTDOWN);
        assert_eq!(code(E::Capacity("needs 9 bytes".into()), false), WEFT_ERR_CAPACITY);
        assert_eq!(code(E::EngineFailed("boom".into()), false), WEFT_ERR_ENGINE_FAILED);
        for s in [
            WEFT_OK,
            WEFT_ERR_INVALID_ARGUMENT,
            WEFT_ERR_MODEL_LOAD,
            WEFT_ERR_NOT_FOUND,
            WEFT_ERR_CAPACITY,
            WEFT_ERR_SHUTDOWN,
            WEFT_ERR_INTERNAL,
            WEFT_ERR_UNSUPPORTED,
            WEFT_ERR_ENGINE_FAILED,
            WEFT_ERR_CANCELLED,
        ] {
            assert_ne!(status_str(s).to_bytes(), b"unknown status", "{s}");
        }
    }
}
