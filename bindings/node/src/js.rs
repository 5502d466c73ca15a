//! Small raw N-API helpers used on the JavaScript thread: reading untyped option objects with
//! precise error messages, persistent references, and building `WeftError` values.
//!
//! Everything here runs on the thread that owns `env` (the JS thread).

use std::cell::RefCell;
use std::ptr;

use napi::bindgen_prelude::{FromNapiValue, ToNapiValue, Unknown};
use napi::{sys, ValueType};

/// A failure to report to JavaScript as a `WeftError { code, message }`.
#[derive(Debug, Clone)]
pub struct Fail {
    pub code: &'static str,
    pub message: String,
}

impl Fail {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Fail { code, message: message.into() }
    }

    /// A caller mistake: an option of the wrong type or out of range, an unknown option...
    pub fn arg(message: impl Into<String>) -> Self {
        Fail::new("INVALID_ARGUMENT", message)
    }

    pub fn closed() -> Self {
        Fail::new("ENGINE_CLOSED", "the engine is closed")
    }

    /// An error from loading a model (the core's one code mapping, as every face uses).
    pub fn loading(e: weft::Error) -> Self {
        Fail::new(e.load_code().as_str(), e.to_string())
    }
}

impl From<weft::Error> for Fail {
    /// An error from a running engine (submitting); see [`Fail::loading`] for loading.
    fn from(e: weft::Error) -> Self {
        Fail::new(e.code().as_str(), e.to_string())
    }
}

impl From<napi::Error> for Fail {
    fn from(e: napi::Error) -> Self {
        Fail::new("INTERNAL", e.reason.clone())
    }
}

pub type Res<T> = std::result::Result<T, Fail>;

fn check(status: sys::napi_status, what: &str) -> Res<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(Fail::new("INTERNAL", format!("N-API call failed: {what} (status {status})")))
    }
}

/// A strong persistent reference to a JS value, deleted on drop (JS thread only).
pub struct JsRef {
    env: sys::napi_env,
    raw: sys::napi_ref,
}

impl JsRef {
    pub fn new(env: sys::napi_env, value: sys::napi_value) -> Res<JsRef> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::napi_create_reference(env, value, 1, &mut raw) }, "create reference")?;
        Ok(JsRef { env, raw })
    }

    pub fn value(&self) -> Res<sys::napi_value> {
        let mut v = ptr::null_mut();
        check(unsafe { sys::napi_get_reference_value(self.env, self.raw, &mut v) }, "read reference")?;
        Ok(v)
    }
}

impl Drop for JsRef {
    fn drop(&mut self) {
        unsafe { sys::napi_delete_reference(self.env, self.raw) };
    }
}

thread_local! {
    /// The `WeftError` class registered by index.js (one per JS environment / thread).
    static ERROR_CLASS: RefCell<Option<JsRef>> = const { RefCell::new(None) };
}

pub fn register_error_class(env: sys::napi_env, ctor: sys::napi_value) -> Res<()> {
    let r = JsRef::new(env, ctor)?;
    ERROR_CLASS.with(|c| *c.borrow_mut() = Some(r));
    Ok(())
}

/// Builds `new WeftError(message, code)`, or a plain `Error` with `code` if index.js did not
/// register the class (the addon required directly).
pub fn error_value(env: sys::napi_env, fail: &Fail) -> Res<sys::napi_value> {
    let msg = string(env, &fail.message)?;
    let code = string(env, fail.code)?;
    let ctor = ERROR_CLASS.with(|c| c.borrow().as_ref().map(|r| r.value()).transpose())?;
    let mut out = ptr::null_mut();
    match ctor {
        Some(ctor) => {
            let args = [msg, code];
            check(unsafe { sys::napi_new_instance(env, ctor, 2, args.as_ptr(), &mut out) }, "new WeftError")?;
        }
        None => check(unsafe { sys::napi_create_error(env, code, msg, &mut out) }, "create error")?,
    }
    Ok(out)
}

/// The `napi::Error` that throws / rejects with exactly `error_value(fail)`.
pub fn to_napi(env: sys::napi_env, fail: &Fail) -> napi::Error {
    match error_value(env, fail) {
        Ok(v) => match unsafe { Unknown::from_napi_value(env, v) } {
            Ok(u) => napi::Error::from(u),
            Err(e) => e,
        },
        Err(f) => napi::Error::from_reason(format!("{}: {}", fail.message, f.message)),
    }
}

pub fn string(env: sys::napi_env, s: &str) -> Res<sys::napi_value> {
    let mut v = ptr::null_mut();
    check(unsafe { sys::napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut v) }, "create string")?;
    Ok(v)
}

pub fn undefined(env: sys::napi_env) -> Res<sys::napi_value> {
    let mut v = ptr::null_mut();
    check(unsafe { sys::napi_get_undefined(env, &mut v) }, "get undefined")?;
    Ok(v)
}

pub fn type_of(env: sys::napi_env, v: sys::napi_value) -> Res<ValueType> {
    let mut t = 0;
    check(unsafe { sys::napi_typeof(env, v, &mut t) }, "typeof")?;
    Ok(ValueType::from(t))
}

pub fn is_array(env: sys::napi_env, v: sys::napi_value) -> Res<bool> {
    let mut b = false;
    check(unsafe { sys::napi_is_array(env, v, &mut b) }, "is array")?;
    Ok(b)
}

pub fn get(env: sys::napi_env, obj: sys::napi_value, key: &str) -> Res<sys::napi_value> {
    let mut v = ptr::null_mut();
    let name = std::ffi::CString::new(key).map_err(|_| Fail::arg("property names cannot contain NUL"))?;
    check(unsafe { sys::napi_get_named_property(env, obj, name.as_ptr(), &mut v) }, "get property")?;
    Ok(v)
}

/// Calls `obj[method](...args)`.
pub fn call_method(
    env: sys::napi_env,
    obj: sys::napi_value,
    method: &str,
    args: &[sys::napi_value],
) -> Res<sys::napi_value> {
    let f = get(env, obj, method)?;
    let mut out = ptr::null_mut();
    check(unsafe { sys::napi_call_function(env, obj, f, args.len(), args.as_ptr(), &mut out) }, method)?;
    Ok(out)
}

/// Own enumerable string keys of a plain object.
pub fn keys(env: sys::napi_env, obj: sys::napi_value) -> Res<Vec<String>> {
    let mut names = ptr::null_mut();
    check(
        unsafe {
            sys::napi_get_all_property_names(
                env,
                obj,
                sys::KeyCollectionMode::own_only,
                sys::KeyFilter::enumerable | sys::KeyFilter::skip_symbols,
                sys::KeyConversion::numbers_to_strings,
                &mut names,
            )
        },
        "list properties",
    )?;
    let n = array_len(env, names)?;
    (0..n).map(|i| as_string(env, element(env, names, i)?)).collect()
}

pub fn array_len(env: sys::napi_env, arr: sys::napi_value) -> Res<u32> {
    let mut n = 0;
    check(unsafe { sys::napi_get_array_length(env, arr, &mut n) }, "array length")?;
    Ok(n)
}

pub fn element(env: sys::napi_env, arr: sys::napi_value, i: u32) -> Res<sys::napi_value> {
    let mut v = ptr::null_mut();
    check(unsafe { sys::napi_get_element(env, arr, i, &mut v) }, "array element")?;
    Ok(v)
}

pub fn as_string(env: sys::napi_env, v: sys::napi_value) -> Res<String> {
    Ok(unsafe { String::from_napi_value(env, v) }?)
}

pub fn as_f64(env: sys::napi_env, v: sys::napi_value) -> Res<f64> {
    Ok(unsafe { f64::from_napi_value(env, v) }?)
}

pub fn as_bool(env: sys::napi_env, v: sys::napi_value) -> Res<bool> {
    Ok(unsafe { bool::from_napi_value(env, v) }?)
}

/// A short description of a JS value for error messages: `-1`, `"abc"`, `an object`...
pub fn describe(env: sys::napi_env, v: sys::napi_value) -> String {
    let t = match type_of(env, v) {
        Ok(t) => t,
        Err(_) => return "an unreadable value".into(),
    };
    match t {
        ValueType::Number => as_f64(env, v).map(fmt_num).unwrap_or_else(|_| "a number".into()),
        ValueType::String => match as_string(env, v) {
            Ok(s) if s.chars().count() <= 40 => format!("{s:?}"),
            Ok(_) => "a long string".into(),
            Err(_) => "a string".into(),
        },
        ValueType::Boolean => as_bool(env, v).map(|b| b.to_string()).unwrap_or_else(|_| "a boolean".into()),
        ValueType::Null => "null".into(),
        ValueType::Undefined => "undefined".into(),
        ValueType::Function => "a function".into(),
        ValueType::BigInt => "a bigint".into(),
        ValueType::Symbol => "a symbol".into(),
        ValueType::Object if is_array(env, v).unwrap_or(false) => "an array".into(),
        _ => "an object".into(),
    }
}

pub fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// Wraps a value already converted to JS.
pub struct Raw(pub sys::napi_value);

impl ToNapiValue for Raw {
    unsafe fn to_napi_value(_env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        Ok(val.0)
    }
}

/// The bytes of a `Uint8Array` (a `Buffer` is one), `None` for any other value; other typed
/// arrays are an argument error (their element bytes would depend on the platform).
pub fn typed_bytes(env: sys::napi_env, v: sys::napi_value, path: &str) -> Res<Option<Vec<u8>>> {
    let mut is_typed = false;
    check(unsafe { sys::napi_is_typedarray(env, v, &mut is_typed) }, "is typed array")?;
    if !is_typed {
        return Ok(None);
    }
    let (mut kind, mut len, mut data, mut offset) = (0, 0usize, std::ptr::null_mut(), 0usize);
    let mut buffer = std::ptr::null_mut();
    check(
        unsafe { sys::napi_get_typedarray_info(env, v, &mut kind, &mut len, &mut data, &mut buffer, &mut offset) },
        "typed array info",
    )?;
    if kind != sys::TypedarrayType::uint8_array {
        return Err(Fail::arg(format!("{path} must be a Uint8Array / Buffer (or a string), got another typed array")));
    }
    if len == 0 {
        return Ok(Some(Vec::new()));
    }
    // SAFETY: napi reports `len` bytes at `data`, alive while `v` is (this call's scope).
    Ok(Some(unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec()))
}
