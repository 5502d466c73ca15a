//! A name → tensor store that layers are built from, with shape checks and mlx-lm's
//! quantization config (global bits/group size plus per-layer overrides).

use std::collections::{BTreeSet, HashMap};

use mlx_rs::Array;

use super::LayerOptions;
use crate::{Error, Result};

/// Affine quantization parameters of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

/// mlx-lm's `"quantization"` config: defaults plus per-module overrides (`false` = not quantized).
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    pub default: Option<QuantSpec>,
    pub overrides: HashMap<String, Option<QuantSpec>>,
}

impl QuantConfig {
    /// Parses `config["quantization"]` (or `quantization_config`) as mlx-lm writes it.
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::ModelLoad("config.json: \"quantization\" must be an object".into()))?;
        let spec = |o: &serde_json::Map<String, serde_json::Value>, what: &str| -> Result<QuantSpec> {
            let group_size = o.get("group_size").and_then(|g| g.as_i64()).unwrap_or(64) as i32;
            let bits = o.get("bits").and_then(|b| b.as_i64()).ok_or_else(|| {
                Error::ModelLoad(format!("config.json: quantization {what} has no integer \"bits\""))
            })? as i32;
            if let Some(mode) = o.get("mode").and_then(|m| m.as_str()) {
                if mode != "affine" {
                    return Err(Error::Unsupported(format!(
                        "quantization mode {mode:?} ({what}); only \"affine\" is supported"
                    )));
                }
            }
            if ![2, 3, 4, 5, 6, 8].contains(&bits) || ![32, 64, 128].contains(&group_size) {
                return Err(Error::Unsupported(format!(
                    "quantization {what}: bits={bits} group_size={group_size}"
                )));
            }
            Ok(QuantSpec { group_size, bits })
        };
        let mut cfg = QuantConfig::default();
        if obj.contains_key("bits") {
            cfg.default = Some(spec(obj, "defaults")?);
        }
        for (k, val) in obj {
            match val {
                serde_json::Value::Object(o) => {
                    cfg.overrides.insert(k.clone(), Some(spec(o, k)?));
                }
                serde_json::Value::Bool(false) => {
                    cfg.overrides.insert(k.clone(), None);
                }
                _ => {}
            }
        }
        Ok(cfg)
    }

    /// The spec for the module at `path` (e.g. `model.layers.0.mlp.down_proj`).
    pub fn spec_for(&self, path: &str) -> Option<QuantSpec> {
        match self.overrides.get(path) {
            Some(s) => *s,
            None => self.default,
        }
    }
}

/// Tensors by name. Layers `take` what they need; anything left over is reported by `finish`.
pub struct Weights {
    tensors: HashMap<String, Array>,
    quant: Option<QuantConfig>,
    /// Names that may be present without being used (e.g. precomputed rotary tables).
    ignorable: Vec<String>,
    /// How the layers built from these weights compute.
    options: LayerOptions,
}

impl Weights {
    /// Weights whose layers get the default [`LayerOptions`] (see [`Weights::with_options`]).
    pub fn new(tensors: HashMap<String, Array>, quant: Option<QuantConfig>) -> Self {
        Weights { tensors, quant, ignorable: Vec::new(), options: LayerOptions::default() }
    }

    /// These weights with the layers built from them computing as `options` says.
    pub fn with_options(mut self, options: LayerOptions) -> Self {
        self.options = options;
        self
    }

    /// The options every layer constructor reads.
    pub fn options(&self) -> &LayerOptions {
        &self.options
    }

    pub fn ignore_suffix(&mut self, suffix: &str) {
        self.ignorable.push(suffix.to_string());
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Renames every tensor `prefix + rest` to `rest` (e.g. a multimodal checkpoint's
    /// `language_model.` part); returns how many were renamed.
    pub fn strip_prefix(&mut self, prefix: &str) -> usize {
        let names: Vec<String> = self.tensors.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        for name in &names {
            let a = self.tensors.remove(name).unwrap();
            self.tensors.insert(name[prefix.len()..].to_string(), a);
        }
        names.len()
    }

    /// Renames every tensor `from + rest` to `to + rest` (Hugging Face's
    /// `model.language_model.` layout of multimodal checkpoints).
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        let names: Vec<String> = self.tensors.keys().filter(|k| k.starts_with(from)).cloned().collect();
        for name in names {
            let a = self.tensors.remove(&name).unwrap();
            self.tensors.insert(format!("{to}{}", &name[from.len()..]), a);
        }
    }

    /// Drops every tensor whose name starts with `prefix` (parts of a checkpoint not used).
    pub fn remove_prefix(&mut self, prefix: &str) {
        self.tensors.retain(|k, _| !k.starts_with(prefix));
    }

    /// Moves every tensor under one of `prefixes` into a set of its own (a checkpoint's tower
    /// loaded apart from its text model), with the same quantization config.
    pub fn split_prefixes(&mut self, prefixes: &[&str]) -> Weights {
        let names: Vec<String> =
            self.tensors.keys().filter(|k| prefixes.iter().any(|p| k.starts_with(p))).cloned().collect();
        let tensors = names.into_iter().map(|n| (n.clone(), self.tensors.remove(&n).unwrap())).collect();
        Weights { tensors, quant: self.quant.clone(), ignorable: Vec::new(), options: self.options.clone() }
    }

    pub fn remove(&mut self, name: &str) -> Option<Array> {
        self.tensors.remove(name)
    }

    /// Adds (or replaces) a tensor, e.g. one rebuilt from checkpoint parts.
    pub fn insert(&mut self, name: String, a: Array) {
        self.tensors.insert(name, a);
    }

    /// Takes a tensor and checks its shape.
    pub fn take(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let a = self
            .tensors
            .remove(name)
            .ok_or_else(|| Error::ModelLoad(format!("missing tensor {name:?}")))?;
        if a.shape() != shape {
            return Err(Error::ModelLoad(format!(
                "tensor {name:?} has shape {:?}, expected {shape:?}",
                a.shape()
            )));
        }
        Ok(a)
    }

    /// Takes an optional tensor (e.g. a bias) and checks its shape when present.
    pub fn take_opt(&mut self, name: &str, shape: &[i32]) -> Result<Option<Array>> {
        if self.tensors.contains_key(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The quantization of module `prefix`, if its weights are quantized (a `.scales` exists).
    pub fn quant_spec(&self, prefix: &str) -> Result<Option<QuantSpec>> {
        if !self.tensors.contains_key(&format!("{prefix}.scales")) {
            return Ok(None);
        }
        self.quant
            .as_ref()
            .and_then(|q| q.spec_for(prefix))
            .map(Some)
            .ok_or_else(|| {
                Error::ModelLoad(format!(
                    "{prefix} has quantized weights but config.json has no quantization settings for it"
                ))
            })
    }

    /// Takes the packed weight, scales and biases of a quantized `[rows, cols]` matrix.
    pub fn take_quantized(
        &mut self,
        prefix: &str,
        rows: i32,
        cols: i32,
        spec: QuantSpec,
    ) -> Result<(Array, Array, Array)> {
        if cols % spec.group_size != 0 || (cols * spec.bits) % 32 != 0 {
            return Err(Error::ModelLoad(format!(
                "{prefix}: {cols} columns are not divisible by group size {} / {} bits",
                spec.group_size, spec.bits
            )));
        }
        let w = self.take(&format!("{prefix}.weight"), &[rows, cols * spec.bits / 32])?;
        let s = self.take(&format!("{prefix}.scales"), &[rows, cols / spec.group_size])?;
        let b = self.take(&format!("{prefix}.biases"), &[rows, cols / spec.group_size])?;
        Ok((w, s, b))
    }

    /// Errors on tensors no layer used (mlx-lm loads strictly too), naming a few.
    pub fn finish(self) -> Result<()> {
        let left: BTreeSet<&String> = self
            .tensors
            .keys()
            .filter(|k| !self.ignorable.iter().any(|s| k.ends_with(s.as_str())))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = left.iter().take(5).map(|s| s.as_str()).collect();
        Err(Error::ModelLoad(format!(
            "{} unexpected tensor(s) in the checkpoint, e.g. {}",
            left.len(),
            names.join(", ")
        )))
    }
}
