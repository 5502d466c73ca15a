// The addon finds libmlx at run time through an rpath: the pinned wheel's lib dir (development,
// so `require` works from any cwd) and `$ORIGIN` / `@loader_path` (libmlx shipped beside
// weft.node, e.g. inside an Electron app). napi_build adds the platform's addon link flags
// (on macOS, `-undefined dynamic_lookup` for the N-API symbols the host process provides).
fn main() {
    napi_build::setup();
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,@loader_path");
    } else {
        println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN");
    }
}
