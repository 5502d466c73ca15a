//! Runs the `weft` npm package's tests (bindings/node/test/*.test.mjs) against the addon this
//! `cargo test` just built, under Node.js (`node --test`, which also runs the `tsc` type check)
//! and under Bun (installed from npm as a devDependency). Part of `cargo test --workspace`, so
//! the addon is built once, with the workspace's features.
//!
//! Without node / npm on PATH the test says so and passes, unless `CI` or `WEFT_REQUIRE_NODE`
//! is set. `bindings/node/test.sh` is the same run through the napi CLI, which also regenerates
//! index.d.ts and fails if the committed one is stale.

#[path = "../../../tests/support/mod.rs"]
mod support;
#[path = "../../../tests/support/hub.rs"]
mod hub;

use std::path::{Path, PathBuf};
use std::process::Command;

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cdylib cargo built for this test run (target/<profile>/[deps/]libweft_node.so).
fn built_addon() -> PathBuf {
    let name = if cfg!(target_os = "macos") { "libweft_node.dylib" } else { "libweft_node.so" };
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    [deps.join(name), deps.parent().expect("profile dir").join(name)]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("{name} not found beside {}", exe.display()))
}

fn have(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

fn run(dir: &Path, program: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("FORCE_COLOR", "0")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{program} {}` failed ({}):\n{text}", args.join(" "), out.status);
    text
}

/// `npm ci` unless node_modules already matches package-lock.json.
fn install_dev_dependencies(dir: &Path) {
    let lock = std::fs::read(dir.join("package-lock.json")).expect("package-lock.json");
    let stamp = dir.join("node_modules").join(".weft-lock");
    if std::fs::read(&stamp).ok().as_deref() == Some(&lock[..]) {
        return;
    }
    run(dir, "npm", &["ci", "--no-audit", "--no-fund", "--loglevel=error"], &[]);
    std::fs::write(&stamp, &lock).expect("write node_modules/.weft-lock");
}

/// Copies the addon to weft.node by rename, so a process that has the old file loaded keeps it.
fn install_addon(dir: &Path) {
    let tmp = dir.join(format!(".weft.node.{}", std::process::id()));
    std::fs::copy(built_addon(), &tmp).expect("copy the addon");
    std::fs::rename(&tmp, dir.join("weft.node")).expect("install weft.node");
}

fn test_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir.join("test"))
        .expect("test dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.mjs"))
        .map(|n| format!("test/{n}"))
        .collect();
    files.sort();
    files
}

/// The `# pass N` / `# fail N` summary of node's TAP output.
fn node_counts(out: &str) -> (usize, usize) {
    let count = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|n| n.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no `{key}` line in node's output:\n{out}"))
    };
    (count("# pass "), count("# fail "))
}

#[test]
fn node_and_bun_suites_pass() {
    let required = std::env::var_os("CI").is_some() || std::env::var_os("WEFT_REQUIRE_NODE").is_some();
    if !have("node") || !have("npm") {
        assert!(!required, "node and npm are required (CI or WEFT_REQUIRE_NODE is set)");
        eprintln!("skipping the Node.js binding tests: node / npm not found");
        return;
    }
    let dir = package_dir();
    install_dev_dependencies(&dir);
    install_addon(&dir);
    let files = test_files(&dir);
    assert!(files.len() >= 4, "test files: {files:?}");

    // The reasoning model the JS suite's reasoning.test.mjs runs (tests/support builds it).
    let models = tempfile::tempdir().expect("a temp dir");
    let qwen35 = support::qwen35_chat_model(models.path());
    let env: Vec<(&str, String)> =
        qwen35.iter().map(|p| ("WEFT_TEST_QWEN35_MODEL", p.display().to_string())).collect();

    // download.test.mjs loads a repo id from this local Hub, into a cache of each runner's own
    // (so both see the download start from nothing).
    let hub = hub::Hub::start(vec![hub::tiny_repo("org/tiny")]);
    let caches = tempfile::tempdir().expect("a temp dir");
    let mut env = env;
    env.push(("WEFT_TEST_HUB", hub.url.clone()));
    env.push(("HF_ENDPOINT", hub.url.clone()));
    let with_cache = |runner: &str| {
        let mut env = env.clone();
        env.push(("HF_HUB_CACHE", caches.path().join(runner).display().to_string()));
        env
    };

    let mut args = vec!["--test", "--test-reporter=tap"];
    args.extend(files.iter().map(String::as_str));
    let out = run(&dir, "node", &args, &with_cache("node"));
    let (pass, fail) = node_counts(&out);
    assert_eq!(fail, 0, "{out}");
    assert!(pass >= 20, "only {pass} node tests passed:\n{out}");

    let bun = dir.join("node_modules").join(".bin").join("bun");
    let out = run(&dir, bun.to_str().unwrap(), &["test", "./test/"], &with_cache("bun"));
    assert!(out.contains(" 0 fail"), "{out}");
    // bun's summary: " 30 pass", " 1 skip", " 0 fail".
    let bun_counts: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.split_once(' ').is_some_and(|(n, w)| n.parse::<u32>().is_ok() && ["pass", "skip", "fail"].contains(&w))
        })
        .collect();
    eprintln!("node: {pass} passed, {fail} failed; bun: {}", bun_counts.join(", "));
}
