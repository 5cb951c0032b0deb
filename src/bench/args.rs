//! `stockade bench`'s options and the plan they make.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use super::Workload;

/// `stockade bench` options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workloads to run, in order [default: hot-sku,hold-hot,confirm,cart,storefront,
    /// uniform,sold-out,product-page,search,refused; --soak: hot-sku].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Option<Vec<Workload>>,
    /// Order strategies to compare (the product page runs once, under the first);
    /// `default` is this build's default strategy, and is shown as e.g. `default (batched)`
    /// [default: redis-lock,pg-atomic,default; --soak: default].
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(
            ["default", "redis-lock", "pg-atomic", "batched"]
        )
    )]
    pub strategies: Option<Vec<String>>,
    /// Instead of the comparison: each workload (one after another, under the first
    /// strategy) at 80 % of the peak measured first, open loop, for this many minutes,
    /// with a row a minute (latency, rate, the app's memory, table sizes, WAL).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_080))]
    pub soak: Option<u64>,
    /// How long a soak's "minute" lasts, in seconds (shorter ones for trying it out).
    #[arg(long, default_value_t = 60, hide = true, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub soak_minute_seconds: u64,
    /// Concurrent request loops (closed loop) [default: 64; --quick: 16].
    #[arg(long)]
    pub connections: Option<usize>,
    /// Seconds of measured load per workload and strategy [default: 15; --quick: 3]
    /// (pgbench runs at least 3).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seconds of unmeasured load before each measurement [default: 2; --quick: 0.5].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// SKUs of the uniform workload [default: 10000; --quick: 1000].
    #[arg(long)]
    pub skus: Option<usize>,
    /// CI-sized: a few seconds per workload, fewer connections and SKUs.
    #[arg(long)]
    pub quick: bool,
    /// Open-loop rate (requests/s) of the extra hot-sku `batched` line [default: 80 % of
    /// the closed-loop rate measured for it]. The storefront's open loop always runs at
    /// 80 % of its own closed-loop rate.
    #[arg(long)]
    pub rate: Option<f64>,
    /// `stockade serve` processes per strategy (connections are spread over them).
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// pgbench clients (`-c`).
    #[arg(long, default_value_t = 16)]
    pub pgbench_clients: usize,
    /// Folder for bench.json, bench.html and the pgbench scripts.
    #[arg(long, default_value = "bench-report")]
    pub out: PathBuf,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// PostgreSQL to use instead of starting one (databases are created beside it).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Redis to use instead of starting one.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Serve with this `stockade` executable instead of this one (to measure another
    /// build, e.g. the previous release, on the same footing).
    #[arg(long)]
    pub server_exe: Option<PathBuf>,
    /// A setting for the served app, `NAME=value` (repeatable), e.g.
    /// `--set STOCKADE_BATCH_WAIT_US=500`.
    #[arg(long = "set", value_parser = setting)]
    pub settings: Vec<(String, String)>,
}

fn setting(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((name, value)) if name.starts_with("STOCKADE_") => {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err("expected STOCKADE_NAME=value".into()),
    }
}

/// An order strategy to serve with, and whether it was named as the build's `default`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Strategy {
    /// What `STOCKADE_ORDER_STRATEGY` is set to: `redis-lock`, `pg-atomic` or `batched`.
    pub name: String,
    /// Named as `default` (this build's default strategy).
    pub default: bool,
}

impl Strategy {
    /// As the report shows it: `batched`, or `default (batched)`.
    pub fn label(&self) -> String {
        label(&self.name, self.default)
    }

    /// The strategies `named` on the command line, `default` resolved to this build's
    /// default ([`crate::config::Settings`]'s); a strategy named twice (`default` and its
    /// own name) runs once, shown as the default.
    fn resolve(named: &[String]) -> Vec<Self> {
        let default = crate::config::Settings::default().order_strategy;
        let mut strategies: Vec<Self> = Vec::new();
        for named in named {
            let (name, is_default) = match named.as_str() {
                "default" => (default.as_str(), true),
                other => (other, false),
            };
            match strategies.iter_mut().find(|s| s.name == name) {
                Some(earlier) => earlier.default |= is_default,
                None => strategies.push(Self {
                    name: name.to_string(),
                    default: is_default,
                }),
            }
        }
        strategies
    }
}

/// A strategy as the report shows it (`default`: named as the build's default).
pub fn label(name: &str, default: bool) -> String {
    if default {
        format!("default ({name})")
    } else {
        name.to_string()
    }
}

/// The options with `--quick` and the defaults applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub workloads: Vec<Workload>,
    /// `--soak`: minutes of open-loop load per workload.
    pub soak_minutes: Option<u64>,
    /// How long one of those minutes is, in seconds (60).
    pub soak_minute_s: u64,
    pub strategies: Vec<Strategy>,
    pub connections: usize,
    pub duration_s: u64,
    pub warmup_s: f64,
    pub skus: usize,
    pub open_loop_rate: Option<f64>,
    pub servers: usize,
    pub pgbench_clients: usize,
    pub quick: bool,
    /// The executable serving the app.
    pub server_exe: PathBuf,
    /// Extra settings for the served app.
    pub settings: Vec<(String, String)>,
    #[serde(skip)]
    pub quiet: bool,
}

/// The shortest pgbench run: its `-T` includes connecting its clients, which on a loaded
/// machine can take most of a second or two, and a run that ends before its first
/// transaction reports no rate at all.
const PGBENCH_MIN_SECONDS: u64 = 3;

impl Plan {
    /// How long each pgbench run lasts: the app's measured time, or longer for a short run.
    pub fn pgbench_seconds(&self) -> u64 {
        self.duration_s.max(PGBENCH_MIN_SECONDS)
    }

    /// Holds seeded for the `confirm` workload: enough for the app's run (warm-up
    /// included) and pgbench's.
    pub fn confirm_holds(&self) -> i64 {
        let seconds = self.duration_s.max(self.pgbench_seconds()) as f64 + self.warmup_s;
        super::workload::confirm_holds(seconds)
    }
}

impl BenchArgs {
    pub(super) fn plan(&self) -> anyhow::Result<Plan> {
        let quick = self.quick;
        let soak = self.soak;
        let workloads = self.workloads.clone().unwrap_or_else(|| match soak {
            Some(_) => vec![Workload::HotSku],
            None => Workload::ALL.to_vec(),
        });
        let strategies = self.strategies.clone().unwrap_or_else(|| match soak {
            Some(_) => vec!["default".into()],
            None => ["redis-lock", "pg-atomic", "default"]
                .map(String::from)
                .to_vec(),
        });
        let plan = Plan {
            workloads,
            soak_minutes: soak,
            soak_minute_s: self.soak_minute_seconds,
            strategies: Strategy::resolve(&strategies),
            connections: self.connections.unwrap_or(if quick { 16 } else { 64 }),
            duration_s: self.duration.unwrap_or(if quick { 3 } else { 15 }),
            warmup_s: self.warmup.unwrap_or(if quick { 0.5 } else { 2.0 }),
            skus: self.skus.unwrap_or(if quick { 1_000 } else { 10_000 }),
            open_loop_rate: self.rate,
            servers: self.servers.max(1),
            pgbench_clients: self.pgbench_clients.max(1),
            quick,
            server_exe: match &self.server_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe().context("cannot find the stockade executable")?,
            },
            settings: self.settings.clone(),
            quiet: self.quiet,
        };
        if plan.workloads.is_empty() || plan.strategies.is_empty() {
            bail!("--workloads and --strategies must name at least one each");
        }
        if soak.is_some()
            && let Some(w) = plan.workloads.iter().find(|w| !w.soaks())
        {
            bail!(
                "--soak runs request workloads that can go on for hours; {} cannot \
                 (its seeded holds, or its pages' flow, run out)",
                w.name()
            );
        }
        if plan.connections == 0 || plan.duration_s == 0 {
            bail!("--connections and --duration must be positive");
        }
        if !(1..=99_999).contains(&plan.skus) {
            bail!("--skus must be between 1 and 99999");
        }
        if !(plan.warmup_s >= 0.0 && plan.warmup_s.is_finite()) {
            bail!("--warmup must be a number of seconds");
        }
        if plan
            .open_loop_rate
            .is_some_and(|r| !(r > 0.0 && r.is_finite()))
        {
            bail!("--rate must be a positive number of requests per second");
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn quick_shortens_what_was_not_given_and_keeps_what_was() {
        let plan = Cli::parse_from(["bench", "--quick", "--connections", "8"])
            .args
            .plan()
            .unwrap();
        assert_eq!(
            (plan.duration_s, plan.connections, plan.skus),
            (3, 8, 1_000)
        );
        let plan = Cli::parse_from(["bench"]).args.plan().unwrap();
        assert_eq!(
            (plan.duration_s, plan.connections, plan.skus),
            (15, 64, 10_000)
        );
        assert_eq!(plan.workloads.len(), 11);
        let labels: Vec<String> = plan.strategies.iter().map(Strategy::label).collect();
        assert_eq!(labels, ["redis-lock", "pg-atomic", "default (batched)"]);
    }

    #[test]
    fn a_soak_runs_the_hot_sku_under_the_default_strategy_unless_told_otherwise() {
        let plan = |args: &[&str]| {
            Cli::try_parse_from(["bench"].iter().chain(args))
                .unwrap()
                .args
                .plan()
        };
        let soak = plan(&["--soak", "30"]).unwrap();
        assert_eq!((soak.soak_minutes, soak.soak_minute_s), (Some(30), 60));
        assert_eq!(soak.workloads, [Workload::HotSku]);
        assert_eq!(soak.strategies[0].label(), "default (batched)");
        let chosen = plan(&["--soak", "5", "--workloads", "uniform,sold-out"]).unwrap();
        assert_eq!(chosen.workloads, [Workload::Uniform, Workload::SoldOut]);
        let refused = plan(&["--soak", "5", "--workloads", "confirm"]).unwrap_err();
        assert!(refused.to_string().contains("confirm cannot"), "{refused}");
        assert!(Cli::try_parse_from(["bench", "--soak", "0"]).is_err());
    }

    #[test]
    fn default_is_the_builds_default_strategy_and_runs_once_beside_its_own_name() {
        let build_default = crate::config::Settings::default().order_strategy;
        assert_eq!(build_default.as_str(), "batched");
        let strategies = |list: &str| {
            Cli::parse_from(["bench", "--strategies", list])
                .args
                .plan()
                .unwrap()
                .strategies
        };
        let plan = strategies("default,redis-lock");
        assert_eq!(
            plan,
            [
                Strategy {
                    name: "batched".into(),
                    default: true
                },
                Strategy {
                    name: "redis-lock".into(),
                    default: false
                }
            ]
        );
        assert_eq!(plan[0].label(), "default (batched)");
        assert_eq!(strategies("batched,default,batched").len(), 1);
        assert!(strategies("batched,default")[0].default);
        assert_eq!(strategies("batched")[0].label(), "batched");
        assert!(
            Cli::try_parse_from(["bench", "--strategies", "fastest"]).is_err(),
            "unknown strategies are refused"
        );
    }
}
