//! The C ABI from C: the committed header is what cbindgen generates from ffi/src; the header,
//! the examples and the C test driver compile cleanly with gcc (C99) and g++ (C++11); the test
//! driver (ffi/tests/c/abi_test.c) runs ≥ 8 concurrent greedy requests on a tiny goldens model
//! and checks every row's tokens against mlx-lm, cancels requests mid-stream, and checks every
//! bad-input case; it also runs under valgrind (memcheck), linked statically, and the examples
//! run on the default model.
//!
//! Regenerate include/weft.h after changing ffi/src:
//!   WEFT_BLESS_HEADER=1 cargo test --release -p weft-ffi --test c_abi header

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use support::{golden, ids, repo_root, tiny_model_dir};
use weft::model_store::{DefaultModel, ModelStore};

/// The model the C tests run on, and the goldens they compare with.
const MODEL: &str = "llama-fp32";

fn header_path() -> PathBuf {
    repo_root().join("include/weft.h")
}

fn generate_header() -> String {
    let ffi = repo_root().join("ffi");
    let config = cbindgen::Config::from_file(ffi.join("cbindgen.toml")).expect("ffi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(ffi.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed on ffi/src");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn header_is_up_to_date() {
    let generated = generate_header();
    let path = header_path();
    if std::env::var("WEFT_BLESS_HEADER").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed.lines().zip(generated.lines()).position(|(a, b)| a != b);
        let line = first.unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/weft.h is stale (first difference at line {}):\n  committed: {:?}\n  generated: {:?}\n\
             Regenerate it with: WEFT_BLESS_HEADER=1 cargo test --release -p weft-ffi --test c_abi header",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            generated.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
    // The fixed parts of the contract (issue: stable C ABI) are spelled as promised (cbindgen
    // writes `struct weft_engine *` where the contract writes the typedef `weft_engine *`).
    let raw = generated.clone();
    let generated = generated
        .replace("struct weft_", "weft_")
        .replace("typedef weft_engine weft_engine;", "typedef struct weft_engine weft_engine;");
    for needle in [
        "#define WEFT_ABI_VERSION 1",
        "uint32_t weft_abi_version(void);",
        "#define WEFT_ABI_MINOR 3",
        "uint32_t weft_abi_minor(void);",
        "WEFT_FINISH_TOOL_CALLS = 3,",
        "WEFT_TOOL_DELTA_START = 1,",
        "WEFT_TOOL_DELTA_ARGUMENTS = 2,",
        "const char *weft_version(void);",
        "typedef struct weft_engine weft_engine;",
        "const char *weft_status_string(int32_t status);",
        "const char *weft_last_error(void);",
        "int32_t weft_engine_new(const char *options_json, weft_engine **out_engine);",
        "void weft_engine_free(weft_engine *engine);",
        "typedef void (*weft_event_fn)(void *user_data, const weft_event *event);",
        "int32_t weft_cancel(weft_engine *engine, uint64_t request_id);",
        "int32_t weft_engine_stats(weft_engine *engine, char *buf, size_t cap, size_t *out_len);",
        "WEFT_EVENT_TOKEN = 1,",
        "WEFT_EVENT_DONE = 2,",
        "WEFT_EVENT_ERROR = 3,",
        "WEFT_FINISH_STOP = 0,",
        "WEFT_FINISH_LENGTH = 1,",
        "WEFT_FINISH_CANCELLED = 2,",
        "WEFT_OK = 0,",
        "WEFT_ERR_INVALID_ARGUMENT = -1,",
        "WEFT_ERR_MODEL_LOAD = -2,",
        "WEFT_ERR_NOT_FOUND = -3,",
        "WEFT_ERR_CAPACITY = -4,",
        "WEFT_ERR_SHUTDOWN = -5,",
        "WEFT_ERR_INTERNAL = -6,",
        "WEFT_ERR_CANCELLED = -9,",
    ] {
        assert!(generated.contains(needle), "include/weft.h lacks `{needle}`");
    }
    let submit = generated.find("int32_t weft_submit(").expect("weft_submit");
    let decl: String = generated[submit..].split(';').next().unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        decl,
        "int32_t weft_submit(weft_engine *engine, const char *request_json, weft_event_fn on_event, \
         void *user_data, uint64_t *out_request_id)"
    );
    // weft_event's leading fields, in the fixed order.
    let start = raw.find("typedef struct weft_event {").expect("weft_event");
    let body = &raw[start..raw[start..].find("} weft_event;").unwrap() + start];
    let fields: Vec<String> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.ends_with(';'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let want = [
        "uint64_t request_id;",
        "int32_t kind;",
        "int32_t token_id;",
        "const char *text;",
        "size_t text_len;",
        "int32_t finish_reason;",
        "uint32_t prompt_tokens;",
        "uint32_t completion_tokens;",
        "uint32_t cached_tokens;",
        "const char *message;",
        "size_t message_len;",
    ];
    assert_eq!(&fields[..want.len()], &want[..], "weft_event's fixed fields");
}

/// Where cargo put this test run's libweft_ffi.so / .a: target/<profile>/deps, beside this test
/// executable. Cargo builds the library (cdylib, staticlib and rlib in one rustc run) before
/// this test because the test depends on the rlib; it copies the cdylib up to target/<profile>
/// only when the library is built on its own, so that copy may be stale and is not used.
fn lib_dir() -> PathBuf {
    let dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    for name in [dylib_name(), "libweft_ffi.a"] {
        assert!(
            dir.join(name).is_file(),
            "{name} not found in {} (is \"rlib\" still in ffi's crate-type?)",
            dir.display()
        );
    }
    dir
}

fn dylib_name() -> &'static str {
    if cfg!(target_os = "macos") {
        "libweft_ffi.dylib"
    } else {
        "libweft_ffi.so"
    }
}

fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Lang {
    C,
    Cxx,
}

#[derive(Clone, Copy, PartialEq)]
enum Link {
    Dynamic,
    Static,
}

/// Compiles (and links) `source` with strict warnings, once per test process (tests run in
/// parallel and share the executables); returns the executable.
fn build(source: &Path, lang: Lang, link: Link) -> PathBuf {
    static BUILT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let exe = exe_path(source, lang, link);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.contains(&exe) {
        compile(source, lang, link, &exe);
        built.push(exe.clone());
    }
    exe
}

fn exe_path(source: &Path, lang: Lang, link: Link) -> PathBuf {
    let stem = source.file_stem().unwrap().to_string_lossy().into_owned();
    let suffix = match (lang, link) {
        (Lang::C, Link::Dynamic) => "c",
        (Lang::Cxx, Link::Dynamic) => "cxx",
        (Lang::C, Link::Static) => "c-static",
        (Lang::Cxx, Link::Static) => "cxx-static",
    };
    work_dir().join(format!("{stem}-{suffix}"))
}

fn compile(source: &Path, lang: Lang, link: Link, exe: &Path) {
    let mut cmd = match lang {
        Lang::C => {
            let mut c = Command::new("gcc");
            c.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]);
            c
        }
        Lang::Cxx => {
            let mut c = Command::new("g++");
            c.args(["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic"]);
            c
        }
    };
    cmd.args(["-g", "-O1", "-I"]).arg(repo_root().join("include")).arg(source);
    if lang == Lang::Cxx {
        cmd.args(["-x", "none"]); // what follows are libraries, not C++ sources
    }
    cmd.arg("-o").arg(exe);
    let lib = &lib_dir();
    match link {
        Link::Dynamic => {
            cmd.arg(format!("-L{}", lib.display()))
                .arg("-lweft_ffi")
                .arg(format!("-Wl,-rpath,{}", lib.display()))
                .arg("-lpthread");
        }
        Link::Static => {
            let mlx = env!("WEFT_MLX_LIBDIR"); // set by ffi/build.rs
            cmd.arg(lib.join("libweft_ffi.a"))
                .arg(format!("-L{mlx}"))
                .arg("-lmlx")
                .arg(format!("-Wl,-rpath,{mlx}"))
                .args(["-lstdc++", "-lgcc_s", "-lpthread", "-lm", "-ldl", "-lrt", "-lutil"]);
        }
    }
    let out = cmd.output().expect("running the C compiler");
    assert!(out.status.success(), "compiling {} ({lang:?}) failed:\n{}", source.display(), show(&out));
}

/// The goldens as the C driver reads them: one row per line,
/// `<max_tokens> <n_prompt> <prompt ids...> <n_expected> <expected ids...>`.
/// All rows of `single`, `batch` and `schedule` (greedy, EOS ignored).
fn cases_file() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(write_cases_file).clone()
}

fn write_cases_file() -> PathBuf {
    let g = golden(MODEL);
    let mut lines = Vec::new();
    let mut add = |prompt: Vec<u32>, tokens: Vec<u32>, max_tokens: usize| {
        let tokens = &tokens[..max_tokens.min(tokens.len())];
        let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        lines.push(format!("{max_tokens} {} {} {} {}", prompt.len(), join(&prompt), tokens.len(), join(tokens)));
    };
    for s in g["single"].as_array().unwrap() {
        // the chunked-prefill duplicate of the 40-token case adds nothing here
        if s["prefill_step_size"].as_u64() == Some(2048) {
            let t = ids(&s["tokens"]);
            add(ids(&s["prompt_ids"]), t.clone(), t.len());
        }
    }
    for b in g["batch"].as_array().unwrap() {
        for r in b["rows"].as_array().unwrap() {
            add(ids(&r["prompt_ids"]), ids(&r["tokens"]), r["max_tokens"].as_u64().unwrap() as usize);
        }
    }
    for r in g["schedule"]["rows"].as_array().unwrap() {
        add(ids(&r["prompt_ids"]), ids(&r["tokens"]), r["max_tokens"].as_u64().unwrap() as usize);
    }
    assert!(lines.len() >= 8, "need at least 8 concurrent rows, have {}", lines.len());
    let path = work_dir().join(format!("{MODEL}-cases.txt"));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Programs find libweft_ffi through their rpath (this run's build), not through the
/// LD_LIBRARY_PATH cargo sets for tests, which also lists target/<profile>, where an older copy
/// of the library may sit.
fn runs_from_rpath(mut cmd: Command) -> Command {
    cmd.env_remove("LD_LIBRARY_PATH").env_remove("DYLD_LIBRARY_PATH");
    cmd
}

/// Every program that runs a model names its CPU kernels (`WEFT_CPU_KERNELS`, read by the
/// library when it loads the model): `exact` where its output is compared with mlx-lm's goldens,
/// `fast` (the library's default) where it is checked against itself or for behaviour.
fn kernels(mut cmd: Command, mode: &str) -> Command {
    cmd.env("WEFT_CPU_KERNELS", mode);
    cmd
}

fn abi_test_source() -> PathBuf {
    repo_root().join("ffi/tests/c/abi_test.c")
}

fn run_abi_test(exe: &Path, mode: &str) -> Output {
    kernels(runs_from_rpath(Command::new(exe)), "exact")
        .arg(tiny_model_dir(MODEL))
        .arg(cases_file())
        .arg(mode)
        .output()
        .expect("running the C test driver")
}

fn assert_pass(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("PASS"), "{what}:\n{}", show(out));
}

#[test]
fn header_compiles_alone_as_c_and_cxx() {
    let src = work_dir().join("header_only.c");
    std::fs::write(
        &src,
        "#include \"weft.h\"\n#include \"weft.h\"\nint main(void) { return WEFT_ABI_VERSION == 1 ? 0 : 1; }\n",
    )
    .unwrap();
    for (compiler, std) in [("gcc", "-std=c99"), ("gcc", "-std=c11"), ("g++", "-std=c++11"), ("g++", "-std=c++17")] {
        let mut cmd = Command::new(compiler);
        if compiler == "g++" {
            cmd.args(["-x", "c++"]);
        }
        let out = cmd
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I"])
            .arg(repo_root().join("include"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(out.status.success(), "{compiler} {std}:\n{}", show(&out));
    }
}

#[test]
fn examples_compile_with_gcc_and_gxx() {
    for name in ["quickstart.c", "chat.c", "concurrent.c"] {
        let src = repo_root().join("examples/c").join(name);
        build(&src, Lang::C, Link::Dynamic);
        build(&src, Lang::Cxx, Link::Dynamic);
    }
}

#[test]
fn c_driver_goldens_concurrency_cancellation_and_errors() {
    let exe = build(&abi_test_source(), Lang::C, Link::Dynamic);
    let out = run_abi_test(&exe, "full");
    assert_pass(&out, "abi_test (gcc) full");
}

#[test]
fn cxx_driver_goldens_concurrency_cancellation_and_errors() {
    let exe = build(&abi_test_source(), Lang::Cxx, Link::Dynamic);
    let out = run_abi_test(&exe, "full");
    assert_pass(&out, "abi_test (g++) full");
}

#[test]
fn statically_linked_driver_runs() {
    let exe = build(&abi_test_source(), Lang::C, Link::Static);
    let out = run_abi_test(&exe, "quick");
    assert_pass(&out, "abi_test (static) quick");
}

#[test]
fn shared_library_finds_libmlx_without_ld_library_path() {
    let exe = build(&abi_test_source(), Lang::C, Link::Dynamic);
    let out = Command::new(&exe)
        .args(["-", "-", "version"])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("DYLD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_pass(&out, "abi_test version without LD_LIBRARY_PATH");
}

/// Memcheck over the whole driver (goldens from concurrent threads, cancellations, every error
/// path, shutdown, free): no invalid reads or writes, no uses of uninitialised values, no
/// definite leaks. No suppressions are needed. (Valgrind's "possibly lost" blocks are the
/// thread-local storage of MLX's worker threads, alive until exit; they are not errors here.)
/// Without `--track-origins`: memcheck reports every use of an uninitialised value either way;
/// the option only adds where the value came from, at a large cost in run time (add it by hand
/// to diagnose a report).
#[test]
fn c_driver_under_valgrind() {
    let exe = build(&abi_test_source(), Lang::C, Link::Dynamic);
    let mut cmd = memcheck("valgrind.log");
    cmd.arg(&exe).arg(tiny_model_dir(MODEL)).arg(cases_file()).arg("full");
    expect_clean_memcheck(cmd, "valgrind.log", "PASS");
}

/// valgrind's memcheck (definite leaks are errors), in exact kernel mode, logging to `log` in
/// the work dir; the program and its arguments follow.
fn memcheck(log: &str) -> Command {
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("valgrind is not installed (apt-get install valgrind); the C ABI memcheck test needs it");
    }
    let mut cmd = kernels(runs_from_rpath(Command::new("valgrind")), "exact");
    cmd.args([
        "--tool=memcheck",
        "--error-exitcode=99",
        "--leak-check=full",
        "--show-leak-kinds=definite",
        "--errors-for-leak-kinds=definite",
        "--num-callers=30",
    ])
    .arg(format!("--log-file={}", work_dir().join(log).display()));
    cmd
}

/// Runs a [`memcheck`] command: it must pass (`pass` on stdout) with no memcheck error.
fn expect_clean_memcheck(mut cmd: Command, log: &str, pass: &str) {
    let out = cmd.output().expect("running valgrind");
    let report = std::fs::read_to_string(work_dir().join(log)).unwrap_or_default();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(pass),
        "valgrind run failed:\n{}\n--- valgrind log ---\n{report}",
        show(&out)
    );
    assert!(report.contains("ERROR SUMMARY: 0 errors"), "valgrind reported errors:\n{report}");
}

#[test]
fn docs_quick_start_is_the_example() {
    let example = std::fs::read_to_string(repo_root().join("examples/c/quickstart.c")).unwrap();
    let docs = std::fs::read_to_string(repo_root().join("docs/c-api.md")).unwrap();
    assert!(
        docs.contains(&format!("```c\n{example}```")),
        "docs/c-api.md's quick start differs from examples/c/quickstart.c"
    );
}

/// The examples against the default model (installed by `weft pull`; required in CI).
#[test]
fn examples_stream_from_the_default_model() {
    let Some(model) = support::default_model() else { return };
    // quickstart.c uses the default model through the model store, as an app would.
    let quick = build(&repo_root().join("examples/c/quickstart.c"), Lang::C, Link::Dynamic);
    // It must not download: point the store at the model's directory when that is not the store.
    let spec = DefaultModel::smollm2();
    let store = if ModelStore::from_env().cached(&spec).is_some() {
        Some(None)
    } else {
        let dir = model.parent().unwrap();
        ModelStore::at(dir).cached(&spec).map(|_| Some(dir.to_path_buf()))
    };
    if let Some(root) = store {
        let mut cmd = kernels(runs_from_rpath(Command::new(&quick)), "fast");
        if let Some(root) = root {
            cmd.env("WEFT_MODELS_DIR", root);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "quickstart:\n{}", show(&out));
    }

    let chat = build(&repo_root().join("examples/c/chat.c"), Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&chat)), "fast")
        .arg("--model")
        .arg(&model)
        // chat.c's own question: the bare "What is the capital of France?" is a near tie on
        // SmolLM2 (exact logits "The" 25.33, "L" 25.24), which the default int8 activations, as
        // llama.cpp, resolve to "L'Étoile, ...".
        .args(["--max-tokens", "24", "What is the capital of France? Answer in one sentence."])
        .output()
        .unwrap();
    assert!(out.status.success(), "chat:\n{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Paris"), "chat answer:\n{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("completion tokens"), "{}", show(&out));

    let conc = build(&repo_root().join("examples/c/concurrent.c"), Lang::Cxx, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&conc)), "fast")
        .arg("--model")
        .arg(&model)
        .args(["--max-tokens", "16", "--cancel-first-after", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "concurrent:\n{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for i in 0..4 {
        assert!(stdout.contains(&format!("=== request {i} (id ")), "row {i} missing:\n{stdout}");
    }
    let first = stdout.lines().find(|l| l.starts_with("=== request 0 (id ")).unwrap();
    assert!(first.ends_with(" tokens, cancelled ==="), "request 0 is cancelled after 2 tokens: {first}");
    assert!(stdout.contains("stats: {"), "{stdout}");
}

#[test]
fn a_dead_engine_thread_is_reported_to_c_and_every_request_ends_once() {
    let source = repo_root().join("ffi/tests/c/fault_test.c");
    let exe = build(&source, Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&exe)), "fast")
        .arg(tiny_model_dir(MODEL))
        .env("WEFT_FAULTS", "driver-panic@6")
        .output()
        .expect("running the C fault test");
    assert_pass(&out, "fault_test.c with WEFT_FAULTS=driver-panic@6");
}

/// Thousands of outstanding requests are delivered by the engine's small delivery pool
/// (ffi/tests/c/pool_test.c): the thread count stays bounded, each request's events in order.
#[test]
fn many_outstanding_requests_use_a_bounded_number_of_threads() {
    let exe = build(&repo_root().join("ffi/tests/c/pool_test.c"), Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&exe)), "fast")
        .arg(tiny_model_dir(MODEL))
        .output()
        .expect("running the C pool test");
    assert_pass(&out, "pool_test.c");
}

#[test]
fn constrained_output_through_the_c_abi() {
    let source = repo_root().join("ffi/tests/c/constrained_test.c");
    let exe = build(&source, Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&exe)), "fast")
        .arg(repo_root().join("goldens/gguf/llama-q4_1.gguf"))
        .output()
        .expect("running the C constrained-output test");
    assert_pass(&out, "constrained_test.c on goldens/gguf/llama-q4_1.gguf");
}

#[path = "support/hub.rs"]
mod hub_fixture;

/// A Hugging Face repo id as "model" (ABI minor 2): weft_engine_new_with_progress reports the
/// download, cancels it when the callback says so (WEFT_ERR_CANCELLED), resumes it on the next
/// call; an unknown repo is WEFT_ERR_MODEL_LOAD with a message naming it.
#[test]
fn hub_models_with_progress_and_cancel_through_the_c_abi() {
    let hub = hub_fixture::Hub::start(vec![hub_fixture::tiny_repo("org/tiny")]);
    let cache = tempfile::tempdir().unwrap();
    for lang in [Lang::C, Lang::Cxx] {
        let exe = build(&repo_root().join("ffi/tests/c/hub_test.c"), lang, Link::Dynamic);
        let dir = cache.path().join(format!("{lang:?}"));
        let out = kernels(runs_from_rpath(Command::new(&exe)), "fast")
            .arg("org/tiny")
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_HUB_CACHE", &dir)
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_TOKEN")
            .output()
            .expect("running the C hub test");
        assert_pass(&out, &format!("hub_test.c ({lang:?})"));
        assert!(dir.join("models--org--tiny/refs/main").is_file());
    }
}

/// Tool calls through weft_event (ABI minor 1) on the tiny GGUF (random weights, a ChatML
/// template without tools: Weft's fallback) and on the default model (required in CI).
#[test]
fn tool_calls_through_the_c_abi() {
    let source = repo_root().join("ffi/tests/c/tools_test.c");
    let exe = build(&source, Lang::C, Link::Dynamic);
    let mut models = vec![repo_root().join("goldens/gguf/llama-q4_1.gguf")];
    models.extend(support::default_model());
    for model in models {
        let out = kernels(runs_from_rpath(Command::new(&exe)), "fast").arg(&model).output().expect("running the C tool-call test");
        assert_pass(&out, &format!("tools_test.c on {}", model.display()));
    }
}

/// Reasoning through the C ABI (ffi/tests/c/reasoning_test.c) on a tiny Qwen3.5 with the real
/// Qwen3 vocabulary and Qwen3.5 template: TOKEN events carry the reasoning apart from the
/// answer, DONE counts reasoning tokens, a budget closes the block, thinking can be turned off.
#[test]
fn reasoning_through_the_c_abi() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = support::qwen35_chat_model(dir.path()) else { return };
    let forced = weft::tokenizer::Tokenizer::from_dir(&model).unwrap().encode("\n</think>", false).unwrap().len();
    let exe = build(&repo_root().join("ffi/tests/c/reasoning_test.c"), Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&exe)), "fast")
        .arg(&model)
        .arg("3")
        .arg(forced.to_string())
        .output()
        .expect("running the C reasoning test");
    assert_pass(&out, "reasoning_test.c");
}

/// Audio in the request contract through the C ABI (ffi/tests/c/media_test.c) on the tiny Gemma
/// 4 audio model: a clip as a path and as a data: URL give mlx-vlm's tokens
/// (goldens/audio_engine.json), bad audio is WEFT_ERR_INVALID_ARGUMENT.
#[test]
fn audio_through_the_c_abi() {
    use base64::Engine as _;
    let exe = build(&repo_root().join("ffi/tests/c/media_test.c"), Lang::C, Link::Dynamic);
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("goldens/audio_engine.json")).unwrap()).unwrap();
    let case = |name: &str| g["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone();
    let tokens = |c: &serde_json::Value| c["tokens"].as_array().unwrap().iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    let (a, b) = (case("tones-44k-stereo"), case("short-16k-mono"));
    let clip = |c: &serde_json::Value| repo_root().join("goldens").join(c["clip"].as_str().unwrap());
    let data_url = format!("data:audio/wav;base64,{}", base64::engine::general_purpose::STANDARD.encode(std::fs::read(clip(&b)).unwrap()));
    let out = kernels(runs_from_rpath(Command::new(&exe)), "exact")
        .arg(repo_root().join("goldens").join(g["model"].as_str().unwrap()))
        .arg(clip(&a))
        .arg(tokens(&a))
        .arg(data_url)
        .arg(tokens(&b))
        .output()
        .expect("running the C media test");
    assert_pass(&out, "media_test.c");
}

/// A PCM16 mono WAV of a ramp whose header claims `rate` Hz (the byte rate wraps as a crafted
/// file's would).
fn crafted_wav(rate: u32, samples: usize) -> Vec<u8> {
    let data_len = (samples * 2) as u32;
    let mut v = Vec::with_capacity(44 + samples * 2);
    v.extend_from_slice(b"RIFF");
    v.extend_from_slice(&(36 + data_len).to_le_bytes());
    v.extend_from_slice(b"WAVEfmt ");
    v.extend_from_slice(&16u32.to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes()); // PCM
    v.extend_from_slice(&1u16.to_le_bytes()); // mono
    v.extend_from_slice(&rate.to_le_bytes());
    v.extend_from_slice(&rate.wrapping_mul(2).to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&16u16.to_le_bytes());
    v.extend_from_slice(b"data");
    v.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..samples {
        v.extend_from_slice(&((i % 2000) as i16 * 8).to_le_bytes());
    }
    v
}

/// The hostile clips of issue 27 and the message part each must be refused with.
fn hardening_cases_file() -> PathBuf {
    use base64::Engine as _;
    let exploit = crafted_wav(u32::MAX, 274);
    assert_eq!(exploit.len(), 592);
    let cases = [
        ("sample rate is 4294967295 Hz", exploit),
        ("sample rate is 1000000 Hz", crafted_wav(1_000_000, 200_000)),
        ("sample rate is 4000000 Hz", crafted_wav(4_000_000, 800_000)),
        ("sample rate is 0 Hz", crafted_wav(0, 274)),
        ("the clip is too short: 200 samples", crafted_wav(16_000, 200)),
    ];
    let text: String = cases
        .iter()
        .map(|(want, wav)| format!("{want}\tdata:audio/wav;base64,{}\n", base64::engine::general_purpose::STANDARD.encode(wav)))
        .collect();
    let path = work_dir().join("hardening_cases.txt");
    std::fs::write(&path, text).unwrap();
    path
}

/// hardening_test.c's arguments after the program: the tiny GGUF, its context, the audio model,
/// the clips, the mode.
fn hardening_args<'a>(cmd: &'a mut Command, mode: &str) -> &'a mut Command {
    let gguf = repo_root().join("goldens/gguf/llama-q4_1.gguf");
    let context = weft::gguf::GgufHeader::read(&gguf).unwrap().get_u64("llama.context_length").unwrap();
    cmd.arg(gguf)
        .arg(context.to_string())
        .arg(repo_root().join("goldens/models/gemma4-audio-lm"))
        .arg(hardening_cases_file())
        .arg(mode)
}

/// issue 27 through the C ABI (ffi/tests/c/hardening_test.c): a 592-byte WAV claiming
/// 4 294 967 295 Hz (it aborted the host: the resampler allocated ~880 GB), 1 MHz and 4 MHz clips
/// (seconds and gigabytes each), a 0 Hz header (a symphonia panic with its backtrace on the host's
/// stderr), a clip too short for the tower, a pathological regex, `kv_group_size: 3` and a
/// prompt at the context length are each refused with WEFT_ERR_INVALID_ARGUMENT and a message,
/// quickly; the host exits normally and nothing panics.
#[test]
fn hostile_media_and_limits_through_the_c_abi() {
    let exe = build(&repo_root().join("ffi/tests/c/hardening_test.c"), Lang::C, Link::Dynamic);
    let mut cmd = kernels(runs_from_rpath(Command::new(&exe)), "exact");
    let out = hardening_args(&mut cmd, "full").output().expect("running the C hardening test");
    assert_pass(&out, "hardening_test.c");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "a panic reached the host's stderr:\n{stderr}");
}

/// The same driver under memcheck: no errors, no definite leaks (an engine that served a
/// constrained request leaked its tokenizer's constraint factory, ~0.55 MB, through an `Arc`
/// cycle).
#[test]
fn hardening_driver_under_valgrind() {
    let exe = build(&repo_root().join("ffi/tests/c/hardening_test.c"), Lang::C, Link::Dynamic);
    let mut cmd = memcheck("valgrind-hardening.log");
    cmd.arg(&exe);
    hardening_args(&mut cmd, "valgrind");
    expect_clean_memcheck(cmd, "valgrind-hardening.log", "PASS hardening_test");
}

/// Prompt-cache entries through the C ABI (ffi/tests/c/prompt_cache_test.c): saved from one
/// engine, loaded by a new one, reused by the same request with the cold run's tokens; bad,
/// missing and other-model files refused with their status.
#[test]
fn prompt_cache_entries_saved_and_loaded_through_the_c_abi() {
    let (dir, other_dir, files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let model = support::chatml_model("llama-fp32", dir.path());
    let other = support::chatml_model("gemma3-text", other_dir.path());
    let exe = build(&repo_root().join("ffi/tests/c/prompt_cache_test.c"), Lang::C, Link::Dynamic);
    let out = kernels(runs_from_rpath(Command::new(&exe)), "exact")
        .arg(&model)
        .arg(&other)
        .arg(files.path())
        .output()
        .expect("running the C prompt-cache test");
    assert_pass(&out, "prompt_cache_test.c");
}
