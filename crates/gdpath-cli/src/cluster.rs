//! `gdpath cluster ls|watch`, and the `--cluster` options that `serve` and `bench net` take:
//! agents published in etcd (docs/cluster.md).

use anyhow::Result;
use clap::{Args, Subcommand};
use gdpath::topo::text::escape;
use gdpath_cluster::{Cluster, ClusterEvent, ClusterUrl};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Where the cluster's etcd is and how to reach it.
#[derive(Debug, Args)]
pub struct ClusterOpts {
    /// The cluster: `etcd://[USER@]HOST:PORT[,HOST:PORT…]/NAMESPACE` (`etcds://` for TLS,
    /// optionally `?ca=FILE&cert=FILE&key=FILE`, which the flags below override). A
    /// password goes in GDPATH_ETCD_PASSWORD rather than the URL: a command line is visible to
    /// other users.
    #[arg(long, value_name = "URL")]
    pub cluster: Option<String>,
    /// PEM file of the CA that signs etcd's certificate (etcds://).
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd's certificate auth (with --etcd-key).
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM key of --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl ClusterOpts {
    /// The parsed URL with its TLS files, or `None` without `--cluster`.
    pub fn url(&self) -> Result<Option<ClusterUrl>> {
        let Some(s) = &self.cluster else {
            return Ok(None);
        };
        let mut u: ClusterUrl = s
            .parse()
            .map_err(|e| crate::usage(format!("--cluster {e}")))?;
        if (self.etcd_ca.is_some() || self.etcd_cert.is_some()) && !u.tls {
            return Err(crate::usage(
                "--etcd-ca/--etcd-cert apply to TLS: write the URL as etcds://…",
            ));
        }
        // A flag overrides the URL's query parameter of the same file.
        if let Some(ca) = &self.etcd_ca {
            u.ca_file = Some(ca.clone());
        }
        if let Some(pair) = self.etcd_cert.clone().zip(self.etcd_key.clone()) {
            u.client_cert = Some(pair);
        }
        Ok(Some(u))
    }

    /// Connects to the cluster `--cluster` names; a usage error without it.
    pub fn connect(&self) -> Result<Cluster> {
        let url = self
            .url()?
            .ok_or_else(|| crate::usage("--cluster URL is required"))?;
        Ok(Cluster::connect(&url)?)
    }
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The agents published: name, incarnation, node, address, regions, lease time left.
    Ls(LsArgs),
    /// Joins, updates and leaves as they happen (first the agents present), until killed.
    Watch(WatchArgs),
}

impl ClusterCommand {
    pub fn json(&self) -> bool {
        match self {
            ClusterCommand::Ls(a) => a.json,
            ClusterCommand::Watch(a) => a.json,
        }
    }
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    cluster: ClusterOpts,
    /// One JSON document (`gdpath.cluster/1`) on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    cluster: ClusterOpts,
    /// One JSON object per line per event.
    #[arg(long)]
    json: bool,
    /// Exit after this many seconds (default: run until killed).
    #[arg(long)]
    duration: Option<f64>,
}

pub fn run(c: ClusterCommand) -> Result<ExitCode> {
    match c {
        ClusterCommand::Ls(a) => ls(a),
        ClusterCommand::Watch(a) => watch(a),
    }
}

fn ls(a: LsArgs) -> Result<ExitCode> {
    let cluster = a.cluster.connect()?;
    let listed = cluster.list()?;
    if a.json {
        let agents: Vec<_> = listed
            .iter()
            .map(|l| match &l.record {
                Ok(r) => serde_json::json!({ "record": r, "ttl_left_s": l.ttl_left }),
                Err(e) => serde_json::json!({ "key": l.key, "invalid": e }),
            })
            .collect();
        let doc = serde_json::json!({
            "schema": "gdpath.cluster/1",
            "cluster": cluster.url().to_string(),
            "agents": agents,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header([
        "NAME",
        "INCARNATION",
        "NODE",
        "ADDRESS",
        "REGIONS",
        "DOCTOR",
        "LEASE",
    ]);
    for l in &listed {
        match &l.record {
            Ok(r) => {
                t.add_row([
                    r.name.clone(),
                    r.incarnation.to_string(),
                    escape(&r.node.hostname).to_string(),
                    r.addr.clone(),
                    regions_text(r),
                    verdicts_text(r),
                    l.ttl_left
                        .map(|s| format!("{s} s"))
                        .unwrap_or_else(|| "none".into()),
                ]);
            }
            Err(e) => {
                // The table's columns are as wide as their widest cell; `--json` keeps it all.
                t.add_row([
                    gdpath_cluster::shown(&l.key, SHOWN_NAME_CHARS),
                    "invalid".into(),
                    e.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
    }
    outln!("{t}");
    if listed.is_empty() {
        errln!("gdpath cluster ls: no agent in {}", cluster.url());
    }
    Ok(ExitCode::SUCCESS)
}

/// Most characters of an invalid record's key shown in the NAME column of `cluster ls` (a valid
/// name has at most 31).
const SHOWN_NAME_CHARS: usize = 40;

/// `host 1 GiB (shm), gpu:0 256 MiB (ipc)`.
fn regions_text(r: &gdpath_cluster::AgentRecord) -> String {
    let parts: Vec<String> = r
        .regions
        .iter()
        .map(|g| {
            let what = match g.gpu {
                Some(n) => format!("gpu:{n}"),
                None => "host".into(),
            };
            let local = if g.shm {
                " (shm)"
            } else if g.cuda_ipc {
                " (ipc)"
            } else {
                ""
            };
            format!("{what} {}{local}", gdpath::units::format_size(g.len))
        })
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// `p2p unavailable, gdr ok, gds degraded`, or `-` before the agent's doctor answered.
fn verdicts_text(r: &gdpath_cluster::AgentRecord) -> String {
    let parts: Vec<String> = r
        .topology
        .verdicts
        .iter()
        .map(|(area, status)| format!("{} {}", escape(area), escape(status)))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn watch(a: WatchArgs) -> Result<ExitCode> {
    let stop = crate::interrupt::flag();
    let cluster = a.cluster.connect()?;
    let w = cluster.watch()?;
    let end = a
        .duration
        .and_then(|s| std::time::Instant::now().checked_add(Duration::from_secs_f64(s.max(0.0))));
    use std::io::Write;
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed)
            || end.is_some_and(|e| std::time::Instant::now() >= e)
        {
            return Ok(ExitCode::SUCCESS);
        }
        let Some(e) = w.next(Duration::from_millis(100)) else {
            continue;
        };
        if a.json {
            outln!("{}", event_json(&e));
        } else {
            outln!("{}", event_text(&e));
        }
        std::io::stdout().flush().ok();
    }
}

fn event_json(e: &ClusterEvent) -> serde_json::Value {
    use serde_json::json;
    match e {
        ClusterEvent::Joined(r) => json!({ "event": "joined", "record": r }),
        ClusterEvent::Updated(r) => json!({ "event": "updated", "record": r }),
        ClusterEvent::Left {
            name,
            incarnation,
            at,
        } => json!({
            "event": "left", "name": name, "incarnation": incarnation,
            "at": at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
        }),
        ClusterEvent::Invalid { key, detail } => {
            json!({ "event": "invalid", "key": key, "detail": detail })
        }
        ClusterEvent::Reconnected { detail } => json!({ "event": "reconnected", "detail": detail }),
    }
}

fn event_text(e: &ClusterEvent) -> String {
    match e {
        ClusterEvent::Joined(r) => format!(
            "joined  {} {} on {} at {} [{}]",
            r.name,
            r.incarnation,
            escape(&r.node.hostname),
            r.addr,
            regions_text(r)
        ),
        ClusterEvent::Updated(r) => format!("updated {} {} at {}", r.name, r.incarnation, r.addr),
        ClusterEvent::Left {
            name, incarnation, ..
        } => format!(
            "left    {name} {}",
            incarnation.as_deref().unwrap_or("(incarnation unknown)")
        ),
        ClusterEvent::Invalid { key, detail } => format!("invalid {key}: {detail}"),
        ClusterEvent::Reconnected { detail } => format!("etcd back after: {detail}"),
    }
}
