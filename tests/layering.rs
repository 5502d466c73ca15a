//! The core crate's layering, checked on its source: every top-level module has a place in
//! one bottom-to-top order ([`ORDER`]) and imports only modules below it, so the crate has no
//! import cycle (docs/architecture.md draws the layers).
//! A reference is any `crate::<module>` path outside a comment, including the members of a
//! `use crate::{...}` group.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Top-level modules: `src/<name>.rs` and `src/<name>/`.
fn modules() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if e.path().is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").filter(|n| *n != "lib").map(str::to_string)
            }
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// First path segments after `crate::` in `code` (comments already removed).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level members of a `{...}` group.
            let (mut depth, mut member, mut end) = (0, String::new(), group.len());
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = j;
                        break;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 && c == ',' {
                    refs.insert(std::mem::take(&mut member));
                } else if depth == 0 {
                    member.push(c);
                }
            }
            refs.insert(member);
            rest = &group[end..];
        } else {
            refs.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    refs.into_iter()
        .map(|r| r.trim().split("::").next().unwrap_or("").trim().to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

/// Module → the other top-level modules its files refer to.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let mut g = BTreeMap::new();
    for m in &mods {
        let mut files = Vec::new();
        let dir = src().join(m);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src().join(format!("{m}.rs")));
        }
        let mut deps = BTreeSet::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let code: String = text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
            deps.extend(crate_refs(&code).into_iter().filter(|r| r != m && mods.contains(r)));
        }
        g.insert(m.clone(), deps);
    }
    g
}

#[test]
fn the_reference_scanner_sees_plain_paths_and_use_groups() {
    let refs = crate_refs("use crate::cache::{self, KvCache};\nuse crate::{\n    nn::Linear,\n    models::{a, b},\n    Result,\n};\nlet x = crate::engine::f();");
    assert_eq!(refs, ["Result", "cache", "engine", "models", "nn"].into_iter().map(String::from).collect());
}

/// Every top-level module of `core/src`, bottom to top: a module may refer only to modules
/// before it. A new module must be placed here (the test fails until it is).
const ORDER: &[&str] = &[
    // Foundations: limits, errors, file formats, the CPU kernels, process groups, pure text logic.
    "limits",
    "error",
    "gguf",
    "kernels",
    "distributed",
    "sampling",
    "reasoning",
    "tokenizer",
    "stop",
    "constrain",
    "tools",
    // Media preprocessing, then what a forward pass needs: caches, the model trait, layers,
    // architectures, and loading them.
    "vision",
    "audio",
    "cache",
    "language_model",
    "nn",
    "models",
    "loading",
    "prefill",
    // The engine and what sits on it: the single-sequence facade, the one place that reads
    // the environment, the model store, the request contract every face parses with (its
    // engine options resolve a model name through the store).
    "engine",
    "generate",
    "env",
    "model_store",
    "contract",
];

#[test]
fn every_module_has_a_place_in_the_order() {
    let mods = modules();
    let placed: BTreeSet<String> = ORDER.iter().map(|m| m.to_string()).collect();
    assert_eq!(ORDER.len(), placed.len(), "a module is listed twice");
    let unplaced: Vec<&String> = mods.difference(&placed).collect();
    let gone: Vec<&String> = placed.difference(&mods).collect();
    assert!(unplaced.is_empty(), "modules missing from ORDER (place them bottom to top): {unplaced:?}");
    assert!(gone.is_empty(), "ORDER names modules that no longer exist: {gone:?}");
}

#[test]
fn no_module_imports_one_above_it() {
    let g = graph();
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let mut up = Vec::new();
    for (m, deps) in &g {
        let Some(level) = rank(m) else { continue };
        for d in deps {
            if rank(d).is_some_and(|r| r > level) {
                up.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(up.is_empty(), "imports pointing up the order (bottom to top: {ORDER:?}): {up:?}");
}
