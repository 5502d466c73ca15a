//! Builds the mlx-c bindings mlx-rs expects, against a pinned prebuilt libmlx.
//!
//! 1. libmlx: the PyPI wheel for this platform (mlx-cpu on Linux, mlx-metal on macOS), pinned by
//!    version and sha256, downloaded with pip into a shared cache and unpacked with its layout kept
//!    (libmlx.so's RPATH `$ORIGIN/../../mlx_cpu.libs` finds the bundled BLAS). `WEFT_MLX_PREFIX`
//!    overrides it with an installed `site-packages/mlx` directory of the same version.
//!    `WEFT_MLX_BACKEND=cuda13|cuda12` (Linux x86_64) keeps compiling and linking against the CPU
//!    wheel — its C++ headers are the CUDA wheels' byte for byte, and libmlx.so has one SONAME —
//!    but points the run-time library path (the rpath dependents set from `DEP_MLX_LIBDIR`) at
//!    the pinned `mlx-cuda-13`/`mlx-cuda-12` wheel of the same version, or at an installed one
//!    named by `WEFT_MLX_RUNTIME_PREFIX`. The CUDA wheels' own cmake config needs a CUDA toolkit
//!    and cuDNN at build time, which a machine that only builds does not have.
//! 2. mlx-c: the sources inside the registry `mlx-sys` 0.7.0 package, which cargo downloads and
//!    checksum-verifies via the tiny locked manifest in `fetch/`, copied into OUT_DIR with one
//!    call patched (`patch_gather_qmm`: mlx-c 0.7.0 wraps MLX 0.32.2, and MLX 0.32.3 inserted
//!    `gather_qmm`'s `global_scale` parameter). Compiled with cmake against (1).
//! 3. Weft's CPU kernels (`kernels/`): custom MLX primitives (quantized matmul, RMSNorm, RoPE,
//!    attention) and the gated delta recurrence's entry points (MLX's fused op, a CUDA kernel
//!    source for `fast::cuda_kernel`), compiled against the same wheel's C++ headers (C++20, libstdc++), their inner
//!    loops once per instruction set (chosen at run time).
//! 4. bindgen over `mlx/c/*.h` and `kernels/weft_kernels.h`, with `shim/weft_mlx_shim.h`
//!    force-included to bridge the header gaps listed in that file.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned MLX. mlx-c 0.7.0 targets 0.32.2; the one public-header break since then that
/// mlx-c meets is `gather_qmm`'s new `global_scale` parameter (0.32.3), patched at build time.
const MLX_VERSION: &str = "0.32.4";

struct Wheel {
    package: &'static str,
    platform: &'static str,
    sha256: &'static str,
}

/// Which libmlx the built programs load at run time (`WEFT_MLX_BACKEND`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Cpu,
    Cuda13,
    Cuda12,
}

fn backend() -> Backend {
    println!("cargo:rerun-if-env-changed=WEFT_MLX_BACKEND");
    match env::var("WEFT_MLX_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("cpu") => Backend::Cpu,
        Ok("cuda13") | Ok("cuda") => Backend::Cuda13,
        Ok("cuda12") => Backend::Cuda12,
        Ok(other) => fail(format!("WEFT_MLX_BACKEND={other:?}: expected cpu, cuda13 or cuda12")),
    }
}

/// The pinned CUDA wheel (same MLX version) for a CUDA backend on Linux x86_64.
fn cuda_wheel(backend: Backend) -> Wheel {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if (os.as_str(), arch.as_str()) != ("linux", "x86_64") {
        fail("WEFT_MLX_BACKEND=cuda* is supported on Linux x86_64 only");
    }
    match backend {
        Backend::Cuda13 => Wheel {
            package: "mlx-cuda-13",
            platform: "manylinux_2_35_x86_64",
            sha256: "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee",
        },
        Backend::Cuda12 => Wheel {
            package: "mlx-cuda-12",
            platform: "manylinux_2_35_x86_64",
            sha256: "f385c7af7c1f63a9d6ce3e442e1c9ba881c881bcb45c6534ff8155b359da47e5",
        },
        Backend::Cpu => unreachable!(),
    }
}

/// The `mlx` directory whose `lib/libmlx.so` the built programs load at run time.
fn runtime_prefix(backend: Backend, build_prefix: &Path) -> PathBuf {
    if backend == Backend::Cpu {
        return build_prefix.to_path_buf();
    }
    println!("cargo:rerun-if-env-changed=WEFT_MLX_RUNTIME_PREFIX");
    let prefix = match env::var_os("WEFT_MLX_RUNTIME_PREFIX") {
        Some(p) => PathBuf::from(p),
        None => unpacked_wheel(&cuda_wheel(backend)),
    };
    if !prefix.join("lib/libmlx.so").exists() {
        fail(format!("{} has no lib/libmlx.so", prefix.display()));
    }
    // NVRTC compiles MLX's CUDA kernels at run time from the headers beside lib/.
    if !prefix.join("include/cutlass").exists() {
        println!(
            "cargo:warning={} lacks include/cutlass: MLX's CUDA kernels will fail to JIT-compile",
            prefix.display()
        );
    }
    prefix
}

fn pinned_wheel() -> Option<Wheel> {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    match (os.as_str(), arch.as_str()) {
        ("linux", "x86_64") => Some(Wheel {
            package: "mlx-cpu",
            platform: "manylinux_2_35_x86_64",
            sha256: "0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee",
        }),
        ("linux", "aarch64") => Some(Wheel {
            package: "mlx-cpu",
            platform: "manylinux_2_35_aarch64",
            sha256: "1289e85e64af1fd16380bf331438bfe4afe875d27afc3e0bcf35f427c488fadd",
        }),
        // Untested here (no Mac in CI): same layout as the CPU wheel plus mlx.metallib.
        ("macos", "aarch64") => Some(Wheel {
            package: "mlx-metal",
            platform: "macosx_14_0_arm64",
            sha256: "8019b2db622599267d66cc168b2f0dbf5af929790a6c3b3913e00eabc42a7947",
        }),
        _ => None,
    }
}

fn fail(msg: impl AsRef<str>) -> ! {
    eprintln!("mlx-sys build error: {}", msg.as_ref());
    panic!("mlx-sys: {}", msg.as_ref());
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| fail(format!("{what}: could not start {cmd:?}: {e}")));
    if !status.success() {
        fail(format!("{what} failed ({status}): {cmd:?}"));
    }
}

fn python() -> String {
    env::var("WEFT_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("WEFT_BUILD_CACHE") {
        return PathBuf::from(dir);
    }
    let home = env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache").join("weft").join("build")
}

/// Returns the `mlx` package directory (holding include/, lib/, share/cmake/MLX).
fn mlx_prefix() -> PathBuf {
    println!("cargo:rerun-if-env-changed=WEFT_MLX_PREFIX");
    if let Some(prefix) = env::var_os("WEFT_MLX_PREFIX") {
        let prefix = PathBuf::from(prefix);
        if !prefix.join("share/cmake/MLX/MLXConfig.cmake").exists() {
            fail(format!("WEFT_MLX_PREFIX={} has no share/cmake/MLX/MLXConfig.cmake", prefix.display()));
        }
        return prefix;
    }
    let wheel = pinned_wheel().unwrap_or_else(|| {
        fail("no pinned MLX wheel for this target; set WEFT_MLX_PREFIX to an installed site-packages/mlx")
    });
    unpacked_wheel(&wheel)
}

/// Downloads (hash-checked) and unpacks `wheel` into the shared build cache once; returns its
/// `mlx` directory.
fn unpacked_wheel(wheel: &Wheel) -> PathBuf {
    let unpacked = cache_root().join(format!("{}-{}-{}", wheel.package, MLX_VERSION, wheel.platform));
    let prefix = unpacked.join("mlx");
    if prefix.join("lib/libmlx.so").exists() || prefix.join("lib/libmlx.dylib").exists() {
        return prefix;
    }
    let download = cache_root().join("download");
    fs::create_dir_all(&download).unwrap();
    // pip verifies the hash (--require-hashes) before anything is unpacked.
    let requirements = download.join(format!("{}-{}.txt", wheel.package, wheel.platform));
    fs::write(
        &requirements,
        format!("{}=={} --hash=sha256:{}\n", wheel.package, MLX_VERSION, wheel.sha256),
    )
    .unwrap();
    run(
        Command::new(python())
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"])
            .args(["--disable-pip-version-check", "--quiet", "--platform", wheel.platform])
            .arg("-r")
            .arg(&requirements)
            .arg("-d")
            .arg(&download),
        "downloading the pinned MLX wheel",
    );
    let file = format!(
        "{}-{}-py3-none-{}.whl",
        wheel.package.replace('-', "_"),
        MLX_VERSION,
        wheel.platform
    );
    let staging = cache_root().join(format!("{}.partial", unpacked.file_name().unwrap().to_string_lossy()));
    let _ = fs::remove_dir_all(&staging);
    run(
        Command::new(python()).args(["-m", "zipfile", "-e"]).arg(download.join(&file)).arg(&staging),
        "unpacking the MLX wheel",
    );
    let _ = fs::remove_dir_all(&unpacked);
    fs::rename(&staging, &unpacked).unwrap();
    prefix
}

/// Locates the mlx-c sources inside the registry mlx-sys package (downloaded by cargo).
fn mlx_c_sources() -> PathBuf {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let fetch_manifest = manifest_dir.join("fetch/Cargo.toml");
    println!("cargo:rerun-if-changed={}", fetch_manifest.display());
    println!("cargo:rerun-if-changed={}", manifest_dir.join("fetch/Cargo.lock").display());
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .args(["metadata", "--locked", "--format-version", "1", "--manifest-path"])
        .arg(&fetch_manifest)
        // The outer build's target settings must not leak into this metadata query.
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap_or_else(|e| fail(format!("cargo metadata: {e}")));
    if !output.status.success() {
        fail(format!(
            "cargo metadata on {} failed: {}",
            fetch_manifest.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    // Find the manifest_path of the registry mlx-sys 0.7.0 package without a JSON dependency.
    let marker = "\"manifest_path\":\"";
    for chunk in text.split(marker).skip(1) {
        let path = &chunk[..chunk.find('"').unwrap_or(0)];
        let path = path.replace("\\\\", "\\");
        if path.contains("mlx-sys-0.7.0") && path.ends_with("Cargo.toml") {
            let root = Path::new(&path).parent().unwrap().join("src/mlx-c");
            if root.join("CMakeLists.txt").exists() {
                return root;
            }
        }
    }
    fail("could not locate the registry mlx-sys 0.7.0 sources via cargo metadata")
}

/// Copies the registry mlx-c sources into OUT_DIR/mlx-c (files whose bytes are unchanged are
/// left alone, so cmake does not rebuild them) and patches `mlx_gather_qmm` for MLX >= 0.32.3.
fn patched_mlx_c(src: &Path) -> PathBuf {
    let dst = PathBuf::from(env::var("OUT_DIR").unwrap()).join("mlx-c");
    copy_tree(src, &dst);
    let ops = dst.join("mlx/c/ops.cpp");
    let text = fs::read_to_string(src.join("mlx/c/ops.cpp")).expect("read mlx-c ops.cpp");
    write_if_changed(&ops, patch_gather_qmm(&text).as_bytes());
    dst
}

/// MLX 0.32.3 added `const std::optional<array>& global_scale` between `mode` and
/// `sorted_indices` in `mlx::core::gather_qmm` (a scale for the nvfp4 mode). mlx-c 0.7.0's
/// wrapper passes `sorted_indices` there; the C signature (which mlx-rs binds) stays as it is
/// and the wrapper passes no global scale.
fn patch_gather_qmm(ops: &str) -> String {
    let start = ops
        .find("extern \"C\" int mlx_gather_qmm(")
        .unwrap_or_else(|| fail("mlx-c ops.cpp: mlx_gather_qmm not found"));
    let end = start
        + ops[start..]
            .find("\n}\n")
            .unwrap_or_else(|| fail("mlx-c ops.cpp: end of mlx_gather_qmm not found"));
    let body = &ops[start..end];
    let from = "std::string(mode),\n            sorted_indices,";
    if body.matches(from).count() != 1 {
        fail("mlx-c ops.cpp: mlx_gather_qmm's call to gather_qmm is not the one this patch expects");
    }
    let body = body.replace(from, "std::string(mode),\n            std::nullopt,\n            sorted_indices,");
    format!("{}{}{}", &ops[..start], body, &ops[end..])
}

fn copy_tree(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for entry in fs::read_dir(src).unwrap_or_else(|e| fail(format!("read {}: {e}", src.display()))) {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to);
        } else {
            write_if_changed(&to, &fs::read(entry.path()).unwrap());
        }
    }
}

fn write_if_changed(path: &Path, bytes: &[u8]) {
    if fs::read(path).ok().as_deref() != Some(bytes) {
        fs::write(path, bytes).unwrap_or_else(|e| fail(format!("write {}: {e}", path.display())));
    }
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let shim_dir = manifest_dir.join("shim");
    let shim = shim_dir.join("weft_mlx_shim.h");
    println!("cargo:rerun-if-changed={}", shim.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=WEFT_PYTHON");
    println!("cargo:rerun-if-env-changed=WEFT_BUILD_CACHE");

    let backend = backend();
    let prefix = mlx_prefix();
    let runtime = runtime_prefix(backend, &prefix);
    let mlx_c = patched_mlx_c(&mlx_c_sources());
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();

    // --- mlx-c (static) against the prebuilt libmlx ---
    let force_include = format!("-include {}", shim.display());
    let mut config = cmake::Config::new(&mlx_c);
    config
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_DIR", prefix.join("share/cmake/MLX"))
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .define("CMAKE_INSTALL_LIBDIR", "lib")
        .define("CMAKE_BUILD_TYPE", "Release")
        .cxxflag(&force_include)
        .build_target("mlxc");
    let dst = config.build();
    let lib_dir = dst.join("build");
    if !lib_dir.join("libmlxc.a").exists() {
        fail(format!("libmlxc.a not produced in {}", lib_dir.display()));
    }

    build_kernels(&manifest_dir.join("kernels"), &prefix, &mlx_c, &shim);

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    let mlx_lib = prefix.join("lib");
    println!("cargo:rustc-link-search=native={}", mlx_lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if target_os == "macos" {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }
    // Dependents read DEP_MLX_LIBDIR to set an rpath (link args don't propagate to them). With
    // a CUDA backend that is the CUDA wheel's lib/: same SONAME, same symbols, loaded instead.
    println!("cargo::metadata=libdir={}", runtime.join("lib").display());
    println!("cargo::metadata=prefix={}", prefix.display());

    // --- bindings ---
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    headers.push(manifest_dir.join("kernels/weft_kernels.h"));
    headers.push(manifest_dir.join("kernels/gated_delta.h"));
    headers.push(manifest_dir.join("kernels/qmv.h"));
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .rust_target("1.73.0".parse().expect("rust-version"))
            .clang_arg(format!("-I{}", mlx_c.display()))
            .clang_arg("-include")
            .clang_arg(shim.display().to_string())
            .blocklist_function("malloc")
            .blocklist_function("realloc"),
        |b, h| b.header(h.to_string_lossy()),
    );
    let bindings = builder.generate().unwrap_or_else(|e| fail(format!("bindgen: {e}")));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings.rs");
}

/// Compiles kernels/ into one static library: the primitives and entry points once, the inner
/// loops (qmm_kernel.cpp, attention_kernel.cpp) once per instruction set with its own -m flags
/// and namespace.
fn build_kernels(dir: &Path, prefix: &Path, mlx_c: &Path, shim: &Path) {
    for file in [
        "qmm_kernel.h",
        "qmm_kernel.cpp",
        "qmm_convert.h",
        "qmm_int8.cpp",
        "qmm_primitive.cpp",
        "row_ops.cpp",
        "vec_exp.h",
        "attention_kernel.h",
        "attention_kernel.cpp",
        "attention.cpp",
        "thread_pool.h",
        "weft_kernels.h",
        "gated_delta.h",
        "gated_delta.cpp",
        "gated_delta_cuda.h",
        "qmv.h",
        "qmv.cpp",
        "qmv_cuda.h",
    ] {
        println!("cargo:rerun-if-changed={}", dir.join(file).display());
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let base = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++20")
            .opt_level(3)
            .include(dir)
            .flag("-fvisibility=hidden")
            // Vector `acc += a * b` becomes an FMA where the target has one.
            .flag("-ffp-contract=fast")
            .warnings(false);
        b
    };
    // (namespace, floats per vector, flags)
    let mut isas: Vec<(&str, &str, &[&str])> = vec![("generic", "4", &[])];
    if arch == "x86_64" {
        isas.push(("avx2", "8", &["-mavx2", "-mfma", "-mf16c"]));
        isas.push(("avx512", "16", &["-mavx512f", "-mavx2", "-mfma", "-mf16c"]));
    }
    let mut objects = Vec::new();
    for (isa, width, flags) in isas {
        let mut b = base();
        b.file(dir.join("qmm_kernel.cpp"))
            .file(dir.join("qmm_int8.cpp"))
            .file(dir.join("attention_kernel.cpp"))
            .define("WEFT_QMM_ISA", isa)
            .define("WEFT_QMM_WIDTH", width);
        for f in flags {
            b.flag(f);
        }
        // Each ISA's objects get their own name (same source file).
        let objs = b.out_dir(PathBuf::from(env::var("OUT_DIR").unwrap()).join(format!("qmm-{isa}"))).compile_intermediates();
        objects.extend(objs);
    }
    if arch == "x86_64" {
        // The int8-activation kernel with AVX-512 VNNI (vpdpbusd on 256-bit vectors), picked
        // at run time where the CPU has it; only that file: the other kernels gain nothing.
        let mut b = base();
        b.file(dir.join("qmm_int8.cpp")).define("WEFT_QMM_ISA", "avx512vnni");
        for f in ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"] {
            b.flag(f);
        }
        objects.extend(b.out_dir(PathBuf::from(env::var("OUT_DIR").unwrap()).join("qmm-avx512vnni")).compile_intermediates());
    }
    let mut b = base();
    b.file(dir.join("qmm_primitive.cpp"))
        .file(dir.join("row_ops.cpp"))
        .file(dir.join("attention.cpp"))
        .file(dir.join("gated_delta.cpp"))
        .file(dir.join("qmv.cpp"))
        .include(prefix.join("include"))
        .include(mlx_c)
        .flag("-include")
        .flag(shim.to_str().unwrap());
    for o in objects {
        b.object(o);
    }
    b.compile("weft_kernels");
}
