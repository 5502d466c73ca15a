//! `weft serve --hostfile FILE`: serving across ranks (docs/distributed.md). The hostfile is
//! `mlx.launch`'s JSON (a list of `{"ssh", "ips"}` hosts, or `{"backend", "envs", "hosts"}`).
//! Rank 0 (no `--rank`, or `--rank 0`) starts the local follower ranks as child processes
//! (`--rank i`), joins the group and serves HTTP; a follower joins, loads its shard and
//! follows rank 0's step plans, serving nothing. Ring ranks listen on `ip:starting_port + i`,
//! as `mlx.launch --backend ring` assigns them; `MLX_RANK` / `MLX_HOSTFILE` set by
//! `mlx.launch` itself are used as they are.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use weft::distributed::Group;
use weft::engine::LockstepOptions;
use weft::loading::{LoadOptions, LoadedModel};
use weft::nn::Parallel;
use weft::{Error, Result};

/// The parsed hostfile: one entry per rank.
struct Host {
    ssh: String,
    ips: Vec<String>,
}

/// This process's place in the rank group.
pub struct Ranks {
    pub group: Group,
    pub opts: LockstepOptions,
    pipeline: bool,
    /// Follower ranks this process started (killed when it exits).
    children: Vec<Child>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn bad(file: &Path, why: impl std::fmt::Display) -> Error {
    Error::InvalidRequest(format!("--hostfile {}: {why}", file.display()))
}

fn parse(file: &Path) -> Result<(Vec<Host>, String, Vec<String>)> {
    let text = std::fs::read_to_string(file).map_err(|e| bad(file, format!("cannot read it: {e}")))?;
    let data: Value = serde_json::from_str(&text).map_err(|e| bad(file, format!("not JSON: {e}")))?;
    let (hosts, backend, envs) = match &data {
        Value::Array(_) => (&data, "", Vec::new()),
        Value::Object(o) => (
            o.get("hosts").ok_or_else(|| bad(file, "no \"hosts\" list"))?,
            o.get("backend").and_then(Value::as_str).unwrap_or(""),
            o.get("envs").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default(),
        ),
        _ => return Err(bad(file, "expected a list of hosts or an object with \"hosts\"")),
    };
    let hosts = hosts
        .as_array()
        .ok_or_else(|| bad(file, "\"hosts\" is not a list"))?
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let ssh = h.get("ssh").and_then(Value::as_str).ok_or_else(|| bad(file, format!("host {i} has no \"ssh\" name")))?;
            let ips: Vec<String> = h.get("ips").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
            Ok(Host { ssh: ssh.to_string(), ips })
        })
        .collect::<Result<Vec<_>>>()?;
    if hosts.len() < 2 {
        return Err(bad(file, format!("{} host(s); a rank group needs at least 2", hosts.len())));
    }
    Ok((hosts, backend.to_string(), envs))
}

fn is_local(ssh: &str) -> bool {
    matches!(ssh, "" | "localhost" | "127.0.0.1" | "::1")
}

/// Joins the group the hostfile describes (starting the local followers first when this is
/// rank 0 and `rank` was not given).
pub fn join(file: &Path, rank: Option<usize>, starting_port: u16, rank_timeout: f64, pipeline: bool) -> Result<Ranks> {
    if !(rank_timeout > 0.0 && rank_timeout.is_finite()) {
        return Err(Error::InvalidRequest("--rank-timeout must be a positive number of seconds".into()));
    }
    let (hosts, backend, envs) = parse(file)?;
    for kv in &envs {
        let (k, v) = kv.split_once('=').ok_or_else(|| bad(file, format!("env {kv:?} is not NAME=VALUE")))?;
        std::env::set_var(k, v);
    }
    let backend = if backend.is_empty() { "ring".to_string() } else { backend };
    let env_rank = std::env::var("MLX_RANK").ok().and_then(|r| r.parse::<usize>().ok());
    let launcher = rank.is_none() && env_rank.is_none();
    let rank = rank.or(env_rank).unwrap_or(0);
    if rank >= hosts.len() {
        return Err(bad(file, format!("rank {rank} but {} hosts", hosts.len())));
    }
    std::env::set_var("MLX_RANK", rank.to_string());
    if backend == "ring" && std::env::var_os("MLX_HOSTFILE").is_none() {
        std::env::set_var("MLX_HOSTFILE", ring_hostfile(file, &hosts, starting_port)?);
    }
    let mut children = Vec::new();
    if launcher {
        for (i, h) in hosts.iter().enumerate().skip(1) {
            if !is_local(&h.ssh) {
                eprintln!("weft serve: start rank {i} on {}: weft serve <same flags> --hostfile {} --rank {i}", h.ssh, file.display());
                continue;
            }
            let args: Vec<String> = std::env::args().skip(1).collect();
            let exe = std::env::current_exe().map_err(|e| Error::io("the weft executable", e))?;
            let child = Command::new(exe)
                .args(&args)
                .args(["--rank", &i.to_string()])
                .env("MLX_RANK", i.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| Error::io("starting a follower rank", e))?;
            super::log_line(&format!("weft serve: rank {i} started (pid {})", child.id()));
            children.push(child);
        }
    }
    let opts = LockstepOptions { rank_timeout: Duration::from_secs_f64(rank_timeout), ..LockstepOptions::default() };
    // MLX's ring init waits for every rank with no timeout of its own.
    let (tx, rx) = std::sync::mpsc::channel();
    let b = backend.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Group::init(&b, true));
    });
    let group = match rx.recv_timeout(opts.startup_timeout) {
        Ok(g) => g?,
        Err(_) => {
            return Err(Error::EngineFailed(format!(
                "the ranks of {} did not all connect within {} s",
                file.display(),
                opts.startup_timeout.as_secs()
            )))
        }
    };
    if group.size() != hosts.len() || group.rank() != rank {
        return Err(bad(file, format!("MLX made rank {} of {}, the hostfile says rank {rank} of {}", group.rank(), group.size(), hosts.len())));
    }
    Ok(Ranks { group, opts, pipeline, children })
}

/// `mlx.launch --backend ring`'s address list: host `i`'s IPs, ports counting up from
/// `starting_port` across hosts.
fn ring_hostfile(file: &Path, hosts: &[Host], starting_port: u16) -> Result<PathBuf> {
    let mut port = starting_port as u32;
    let mut ring = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        if h.ips.is_empty() {
            return Err(bad(file, format!("host {i} has no \"ips\" (the ring backend needs IP addresses)")));
        }
        let mut node = Vec::new();
        for ip in &h.ips {
            let p = u16::try_from(port).map_err(|_| bad(file, "ports past 65535"))?;
            node.push(format!("{ip}:{p}"));
            port += 1;
        }
        ring.push(node);
    }
    let path = std::env::temp_dir().join(format!("weft-ring-{}-{starting_port}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&ring).expect("a list of strings")).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

impl Ranks {
    /// Loads this rank's shard (tensor parallel, or its pipeline stage).
    pub fn load(&self, path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
        let group = self.group.clone();
        let parallel = if self.pipeline { Parallel::Pipeline(group) } else { Parallel::Tensor(group) };
        weft::loading::load_with(path, &LoadOptions { parallel: Some(parallel), ..options.clone() })
    }
}
