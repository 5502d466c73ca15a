// swift-tools-version:5.9
//
// Weft for Swift. Build the Rust half first (it also generates the bridge code this package
// compiles):
//
//     cargo build --release -p weft-swift
//
// That writes `.weft-rust-build` next to this file with where `libweft_swift.a` and the pinned
// MLX library (`libmlx.so` / `libmlx.dylib`) are; the environment variables WEFT_RUST_LIB_DIR and
// WEFT_MLX_LIB_DIR override it. See docs/swift.md.

import Foundation
import PackageDescription

let packageDir = URL(fileURLWithPath: #filePath).deletingLastPathComponent().path

/// `key=value` lines written by rust/build.rs.
func rustBuildSettings() -> [String: String] {
    guard let text = try? String(contentsOfFile: packageDir + "/.weft-rust-build", encoding: .utf8) else {
        return [:]
    }
    var settings: [String: String] = [:]
    for line in text.split(separator: "\n") {
        let parts = line.split(separator: "=", maxSplits: 1)
        if parts.count == 2 { settings[String(parts[0])] = String(parts[1]) }
    }
    return settings
}

let environment = ProcessInfo.processInfo.environment
let written = rustBuildSettings()
let rustLibDir = environment["WEFT_RUST_LIB_DIR"] ?? written["rust_lib_dir"] ?? packageDir + "/../../target/release"
let mlxLibDir = environment["WEFT_MLX_LIB_DIR"] ?? written["mlx_lib_dir"]

var searchFlags = ["-L", rustLibDir]
if let mlx = mlxLibDir {
    // The rpath lets tests and command-line tools find libmlx in place; apps ship their own copy
    // (docs/swift.md, "What ships inside an app").
    searchFlags += ["-L", mlx, "-Xlinker", "-rpath", "-Xlinker", mlx]
}

let package = Package(
    name: "Weft",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "Weft", targets: ["Weft"]),
    ],
    targets: [
        // C declarations of the swift-bridge glue; its module map links libweft_swift.a.
        .systemLibrary(name: "CWeft", path: "Sources/CWeft"),
        // The generated Swift glue (Sources/WeftBridge/Generated) plus the event sink it calls.
        .target(
            name: "WeftBridge",
            dependencies: ["CWeft"],
            path: "Sources/WeftBridge",
            linkerSettings: [
                .unsafeFlags(searchFlags),
                .linkedLibrary("mlx"),
                // What the Rust static library needs besides libmlx (`cargo rustc ... --print
                // native-static-libs`); Swift links the C library and pthread itself.
                .linkedLibrary("c++", .when(platforms: [.macOS])),
                .linkedLibrary("iconv", .when(platforms: [.macOS])),
                .linkedFramework("Security", .when(platforms: [.macOS])),
                .linkedFramework("CoreFoundation", .when(platforms: [.macOS])),
                .linkedLibrary("stdc++", .when(platforms: [.linux])),
                .linkedLibrary("m", .when(platforms: [.linux])),
                .linkedLibrary("dl", .when(platforms: [.linux])),
                .linkedLibrary("pthread", .when(platforms: [.linux])),
                .linkedLibrary("gcc_s", .when(platforms: [.linux])),
                .linkedLibrary("rt", .when(platforms: [.linux])),
                .linkedLibrary("util", .when(platforms: [.linux])),
            ]
        ),
        // The public, idiomatic API.
        .target(name: "Weft", dependencies: ["WeftBridge"], path: "Sources/Weft"),
        .testTarget(name: "WeftTests", dependencies: ["Weft"], path: "Tests/WeftTests"),
    ]
)
