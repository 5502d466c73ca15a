//! The core crate's layering, checked on its source: `cache` sits below `nn`, `nn` below
//! `models`, and none of the three reaches up into the engine (docs/architecture.md draws it).
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

#[test]
fn cache_nn_and_models_are_layered_without_cycles() {
    let g = graph();
    for m in ["cache", "nn", "models", "language_model", "engine"] {
        assert!(g.contains_key(m), "module {m} not found under {}", src().display());
    }
    let forbidden: [(&str, &[&str]); 4] = [
        ("cache", &["nn", "models", "language_model", "engine", "generate", "loading"]),
        ("language_model", &["nn", "models", "engine", "generate", "loading"]),
        ("nn", &["models", "engine", "generate", "loading"]),
        ("models", &["engine", "generate", "loading"]),
    ];
    for (m, above) in forbidden {
        let up: Vec<&String> = g[m].iter().filter(|d| above.contains(&d.as_str())).collect();
        assert!(up.is_empty(), "`{m}` imports {up:?}, which sit above it");
    }
    // And among the four, the imports form no cycle (a topological order exists).
    let layer = ["cache", "language_model", "nn", "models"];
    let mut left: BTreeSet<&str> = layer.into_iter().collect();
    while !left.is_empty() {
        let free: Vec<&str> =
            left.iter().copied().filter(|m| g[*m].iter().all(|d| !left.contains(d.as_str()))).collect();
        assert!(!free.is_empty(), "import cycle among {left:?}: {:?}", left.iter().map(|m| (m, &g[*m])).collect::<Vec<_>>());
        for m in free {
            left.remove(m);
        }
    }
}
