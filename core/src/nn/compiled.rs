//! Elementwise chains of the decode hot path compiled with MLX's `compile` (shapeless, as
//! mlx-lm's `swiglu` and mlx's `gelu_approx` are), so each runs as one fused kernel instead of
//! one launch per op: SwiGLU and GeGLU. A model uses them when its load options say so
//! ([`super::LayerOptions::compile`]). MLX computes every op of a fused kernel in that op's own
//! dtype, so the outputs equal the op-by-op graph's (checked against the goldens with compile
//! on in tests/parity_single.rs).
//!
//! One compiled closure per chain serves the whole process: the chains are pure, and MLX keeps
//! its compile cache per thread, so engines on different threads trace their own copies.

use std::os::raw::c_int;
use std::sync::OnceLock;

use mlx_rs::Array;
use mlx_sys::{mlx_array_new, mlx_closure, mlx_vector_array};

use crate::{Error, Result};

/// A compiled MLX closure over arrays.
struct CompiledFn(mlx_closure);

// SAFETY: the closure is immutable after `mlx_compile`; applying it from several threads uses
// each thread's own compile cache (MLX's `detail::compile_cache` is per thread).
unsafe impl Send for CompiledFn {}
unsafe impl Sync for CompiledFn {}

type Body = unsafe extern "C" fn(*mut mlx_vector_array, mlx_vector_array) -> c_int;

impl CompiledFn {
    fn new(body: Body) -> Result<Self> {
        // SAFETY: `body` is a plain function; the traced closure is freed once compiled.
        unsafe {
            let traced = mlx_sys::mlx_closure_new_func(Some(body));
            let mut compiled = mlx_sys::mlx_closure_new();
            let status = mlx_sys::mlx_compile(&mut compiled, traced, true);
            mlx_sys::mlx_closure_free(traced);
            if status != 0 {
                mlx_sys::mlx_closure_free(compiled);
                return Err(Error::Mlx("compiling an elementwise chain failed".into()));
            }
            Ok(CompiledFn(compiled))
        }
    }

    fn apply(&self, inputs: &[&Array]) -> Result<Array> {
        let ptrs: Vec<_> = inputs.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: the input vector copies the handles (MLX reference counts them); the result
        // vector is owned here and freed after its first element is taken.
        unsafe {
            let input = mlx_sys::mlx_vector_array_new_data(ptrs.as_ptr(), ptrs.len());
            let mut out = mlx_sys::mlx_vector_array_new();
            let status = mlx_sys::mlx_closure_apply(&mut out, self.0, input);
            mlx_sys::mlx_vector_array_free(input);
            if status != 0 || mlx_sys::mlx_vector_array_size(out) != 1 {
                mlx_sys::mlx_vector_array_free(out);
                return Err(Error::Mlx("a compiled elementwise chain failed".into()));
            }
            let mut y = mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut y, out, 0);
            mlx_sys::mlx_vector_array_free(out);
            Ok(Array::from_ptr(y))
        }
    }
}

/// Input `i` of a closure call as an owned array.
unsafe fn input(v: mlx_vector_array, i: usize) -> Array {
    let mut a = mlx_array_new();
    mlx_sys::mlx_vector_array_get(&mut a, v, i);
    Array::from_ptr(a)
}

/// Runs a two-input chain inside a closure call: nonzero on error or panic (MLX raises it).
unsafe fn binary(res: *mut mlx_vector_array, v: mlx_vector_array, f: fn(&Array, &Array) -> Result<Array>) -> c_int {
    let (a, b) = (input(v, 0), input(v, 1));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&a, &b))) {
        Ok(Ok(y)) => mlx_sys::mlx_vector_array_set_value(res, y.as_ptr()),
        _ => 1,
    }
}

unsafe extern "C" fn swiglu_body(res: *mut mlx_vector_array, v: mlx_vector_array) -> c_int {
    binary(res, v, super::swiglu)
}

unsafe extern "C" fn geglu_body(res: *mut mlx_vector_array, v: mlx_vector_array) -> c_int {
    binary(res, v, |gate, up| Ok(super::gelu_approx(gate)?.multiply(up)?))
}

fn compiled(cell: &'static OnceLock<std::result::Result<CompiledFn, String>>, body: Body) -> Result<&'static CompiledFn> {
    cell.get_or_init(|| CompiledFn::new(body).map_err(|e| e.to_string())).as_ref().map_err(|e| Error::Mlx(e.clone()))
}

/// [`super::swiglu`] as one fused kernel.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    static F: OnceLock<std::result::Result<CompiledFn, String>> = OnceLock::new();
    compiled(&F, swiglu_body)?.apply(&[gate, up])
}

/// `gelu_approx(gate) * up` ([`super::gelu_approx`]) as one fused kernel.
pub fn geglu(gate: &Array, up: &Array) -> Result<Array> {
    static F: OnceLock<std::result::Result<CompiledFn, String>> = OnceLock::new();
    compiled(&F, geglu_body)?.apply(&[gate, up])
}

/// The number of operations (graph nodes with a primitive) not yet evaluated behind `outputs`,
/// by primitive name, most frequent first: what evaluating them launches, before MLX's own
/// fusion. For profiling a decode step (benches/step_profile.rs).
pub fn graph_ops(outputs: &[&Array]) -> Result<Vec<(String, usize)>> {
    let text = graph_text(outputs)?;
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with("Inputs") && !l.starts_with("Outputs")) {
        let name = line.split([' ', '(']).next().unwrap_or("").to_string();
        *counts.entry(name).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(v)
}

/// MLX's `print_graph` of what is not yet evaluated behind `outputs`: inputs, outputs, then
/// one line per operation.
#[cfg(unix)]
pub fn graph_text(outputs: &[&Array]) -> Result<String> {
    let ptrs: Vec<_> = outputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: `open_memstream` owns `buf` until `fclose`, after which it is read and freed.
    unsafe {
        let mut buf: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        let file = libc::open_memstream(&mut buf, &mut len);
        if file.is_null() {
            return Err(Error::Mlx("open_memstream failed".into()));
        }
        let v = mlx_sys::mlx_vector_array_new_data(ptrs.as_ptr(), ptrs.len());
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_print_graph(file as *mut mlx_sys::FILE, namer, v);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(v);
        libc::fclose(file);
        let text = if buf.is_null() { String::new() } else { std::ffi::CStr::from_ptr(buf).to_string_lossy().into_owned() };
        libc::free(buf as *mut libc::c_void);
        if status != 0 {
            return Err(Error::Mlx("printing the graph failed".into()));
        }
        Ok(text)
    }
}

#[cfg(not(unix))]
pub fn graph_text(_outputs: &[&Array]) -> Result<String> {
    Err(Error::Unsupported("graph printing needs open_memstream".into()))
}
