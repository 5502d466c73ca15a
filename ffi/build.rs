// Binaries, test executables and the shared library of this crate find libmlx at run time
// through an rpath: the pinned wheel's lib dir (development) and `$ORIGIN` (libmlx shipped
// beside libweft_ffi). `WEFT_MLX_LIBDIR` tells the C ABI tests where libmlx is, for linking the
// static library.
fn main() {
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
        println!("cargo:rustc-env=WEFT_MLX_LIBDIR={libdir}");
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,@loader_path");
        // Apps embed the dylib and find it through their own rpath (e.g. @executable_path/../Frameworks).
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libweft_ffi.dylib");
    } else {
        println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN");
    }
}
