//! Typed reads from `config.json` with errors that name the key.

use serde_json::Value;

use crate::nn::{Rope, RopeContext};
use crate::{Error, Result};

pub struct ConfigReader<'a> {
    v: &'a Value,
}

impl<'a> ConfigReader<'a> {
    pub fn new(v: &'a Value) -> Self {
        ConfigReader { v }
    }

    /// The whole config object.
    pub fn raw(&self) -> &'a Value {
        self.v
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|x| !x.is_null())
    }

    pub fn req_str(&self, key: &str) -> Result<String> {
        self.get(key)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| Error::ModelLoad(format!("config.json: missing or non-string {key:?}")))
    }

    pub fn req_i32(&self, key: &str) -> Result<i32> {
        let x = self
            .get(key)
            .ok_or_else(|| Error::ModelLoad(format!("config.json: missing {key:?}")))?;
        x.as_i64()
            .filter(|n| *n > 0 && *n < i32::MAX as i64)
            .map(|n| n as i32)
            .ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a positive integer, got {x}")))
    }

    pub fn opt_i32(&self, key: &str) -> Result<Option<i32>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.req_i32(key).map(Some),
        }
    }

    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a number, got {x}"))),
        }
    }

    pub fn req_f32(&self, key: &str) -> Result<f32> {
        if self.get(key).is_none() {
            return Err(Error::ModelLoad(format!("config.json: missing {key:?}")));
        }
        self.f32_or(key, 0.0)
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a boolean, got {x}"))),
        }
    }

    /// RoPE from `rope_theta` and `rope_scaling` (or transformers 5's `rope_parameters`, which
    /// may carry the theta too), as mlx-lm's `initialize_rope`: every scaling kind of
    /// [`Rope::from_scaling`]; others fail here, naming the kind. `dims` is the rotated
    /// feature count (`head_dim` unless the architecture rotates part of each head).
    pub fn rope(&self, dims: i32, default_theta: Option<f32>, traditional: bool) -> Result<Rope> {
        let params = self.get("rope_parameters");
        let theta = match (self.get("rope_theta"), params.and_then(|p| p.get("rope_theta")), default_theta) {
            (Some(_), _, _) => self.req_f64("rope_theta")?,
            (None, Some(t), _) => t.as_f64().unwrap_or(10000.0),
            (None, None, Some(d)) => d as f64,
            (None, None, None) => return Err(Error::ModelLoad("config.json: missing \"rope_theta\"".into())),
        };
        let scaling = self.get("rope_scaling").or(params);
        let ctx = RopeContext { max_position_embeddings: self.opt_i32("max_position_embeddings")? };
        Rope::from_scaling(dims, theta, traditional, scaling, ctx)
    }

    fn req_f64(&self, key: &str) -> Result<f64> {
        let x = self.get(key).ok_or_else(|| Error::ModelLoad(format!("config.json: missing {key:?}")))?;
        x.as_f64().ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a number, got {x}")))
    }
}
