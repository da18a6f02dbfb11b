//! What `sluice bench` found: counts, latency percentiles and, when asked,
//! what the run cost Redis, as a readable table or as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The server driven.
    pub addr: String,
    /// The domain of every request.
    pub domain: String,
    /// Requests in flight.
    pub concurrency: usize,
    /// HTTP/2 connections they share.
    pub connections: usize,
    /// The paced request rate, if one was set (requests/s).
    pub rate: Option<f64>,
    /// Distinct keys and how they were drawn.
    pub keys: u64,
    /// `uniform` or `zipf`.
    pub distribution: String,
    /// Warm-up before measuring, seconds.
    pub warmup_s: f64,
    /// The measured run, seconds.
    pub elapsed_s: f64,
    /// Answers with a decision (OK or OVER_LIMIT).
    pub decisions: u64,
    /// Decisions per second.
    pub decisions_per_s: f64,
    /// `overall_code` OK.
    pub ok: u64,
    /// `overall_code` OVER_LIMIT.
    pub over_limit: u64,
    /// Failed calls by gRPC status (or `TIMEOUT`).
    pub errors: BTreeMap<String, u64>,
    /// Latency of the decisions, milliseconds (when paced, from when each
    /// request was due, so a slow server cannot hide its queue).
    pub latency_ms: Latency,
    /// What the run cost Redis, with `--redis-url`.
    pub redis: Option<RedisCost>,
    /// Why there are no Redis figures although `--redis-url` was given (the
    /// reading after the run failed).
    pub redis_error: Option<String>,
}

/// Latency percentiles, milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// The summary of a histogram of microseconds.
    pub fn from_micros(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1_000.0;
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1_000.0,
        }
    }
}

/// Calls and server time of one Redis command over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CommandCost {
    /// Times it ran.
    pub calls: u64,
    /// Server microseconds it took, in total.
    pub usec: u64,
}

/// One reading of `INFO commandstats` and `INFO cpu`, summed over servers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RedisSnapshot {
    /// Per command (`config|get` style names for subcommands).
    pub commands: BTreeMap<String, CommandCost>,
    /// Main-thread CPU time (user + system), microseconds.
    pub cpu_usec: f64,
}

/// Commands that run Lua: Redis counts the commands a script calls as well,
/// and a script's time includes theirs.
const SCRIPT_COMMANDS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// Commands that a benchmark's own reading or an operator's tools send, not
/// the server under test.
const ADMIN_COMMANDS: [&str; 14] = [
    "info", "config", "ping", "client", "hello", "cluster", "script", "command", "select", "auth",
    "memory", "slowlog", "latency", "quit",
];

impl RedisSnapshot {
    /// Adds one server's `INFO commandstats cpu` text.
    pub fn add_info(&mut self, text: &str) {
        let mut cpu_main = 0.0;
        let mut cpu_all = 0.0;
        let mut has_main = false;
        for line in text.lines() {
            let Some((name, value)) = line.trim().split_once(':') else {
                continue;
            };
            if let Some(command) = name.strip_prefix("cmdstat_") {
                let field = |key: &str| {
                    value
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                let cost = self.commands.entry(command.to_owned()).or_default();
                cost.calls += field("calls");
                cost.usec += field("usec");
                continue;
            }
            let seconds = value.parse::<f64>().unwrap_or(0.0);
            match name {
                "used_cpu_sys_main_thread" | "used_cpu_user_main_thread" => {
                    has_main = true;
                    cpu_main += seconds;
                }
                "used_cpu_sys" | "used_cpu_user" => cpu_all += seconds,
                _ => {}
            }
        }
        // Older servers report only the process total.
        self.cpu_usec += 1e6 * if has_main { cpu_main } else { cpu_all };
    }

    /// What happened between `self` and the later `after`, per decision.
    pub fn cost(&self, after: &RedisSnapshot, decisions: u64) -> RedisCost {
        let per = |n: f64| n / decisions.max(1) as f64;
        let mut commands = BTreeMap::new();
        for (name, late) in &after.commands {
            let early = self.commands.get(name).copied().unwrap_or_default();
            let base = name.split('|').next().unwrap_or(name);
            if ADMIN_COMMANDS.contains(&base) || late.calls <= early.calls {
                continue;
            }
            commands.insert(
                name.clone(),
                CommandCost {
                    calls: late.calls - early.calls,
                    usec: late.usec.saturating_sub(early.usec),
                },
            );
        }
        let sum = |scripts: bool| {
            commands
                .iter()
                .filter(|(name, _)| SCRIPT_COMMANDS.contains(&name.as_str()) == scripts)
                .fold(CommandCost::default(), |a, (_, c)| CommandCost {
                    calls: a.calls + c.calls,
                    usec: a.usec + c.usec,
                })
        };
        let (scripts, others) = (sum(true), sum(false));
        // A script's time already includes the commands it called, and Redis
        // cannot tell those from commands sent by clients: with scripts, the
        // scripts' time is the server time.
        let usec = if scripts.calls > 0 {
            scripts.usec
        } else {
            others.usec
        };
        RedisCost {
            calls_per_decision: per((scripts.calls + others.calls) as f64),
            script_calls_per_decision: per(scripts.calls as f64),
            usec_per_decision: per(usec as f64),
            cpu_usec_per_decision: per((after.cpu_usec - self.cpu_usec).max(0.0)),
            commands,
        }
    }
}

/// What the measured run cost Redis, per decision.
#[derive(Clone, Debug, Serialize)]
pub struct RedisCost {
    /// Every command Redis ran (those called by scripts included: Redis
    /// counts them too).
    pub calls_per_decision: f64,
    /// `EVAL`/`EVALSHA`/`FCALL` calls.
    pub script_calls_per_decision: f64,
    /// Server microseconds from `INFO commandstats`: the scripts' time when
    /// scripts ran (it includes their commands), else every command's.
    pub usec_per_decision: f64,
    /// Main-thread CPU microseconds from `INFO cpu`: commands, parsing and
    /// network I/O together.
    pub cpu_usec_per_decision: f64,
    /// Each command's calls and time over the run.
    pub commands: BTreeMap<String, CommandCost>,
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Report {
    /// The report as a readable table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let paced = self
            .rate
            .map(|r| format!(", paced at {}/s", thousands(r as u64)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "sluice bench: {} domain {}, {} in flight on {} connection(s){paced}, {} over {} key(s)",
            self.addr,
            self.domain,
            self.concurrency,
            self.connections,
            self.distribution,
            thousands(self.keys)
        );
        let _ = writeln!(
            out,
            "measured {:.2} s after a {:.2} s warm-up\n",
            self.elapsed_s, self.warmup_s
        );
        let errors: u64 = self.errors.values().sum();
        let _ = writeln!(
            out,
            "  decisions/s   {:>12}",
            thousands(self.decisions_per_s.round() as u64)
        );
        let _ = writeln!(
            out,
            "  decisions     {:>12}   OK {}, OVER_LIMIT {}",
            thousands(self.decisions),
            thousands(self.ok),
            thousands(self.over_limit)
        );
        let detail = self
            .errors
            .iter()
            .map(|(code, n)| format!("{code} {}", thousands(*n)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "  errors        {:>12}   {detail}", thousands(errors));
        out.truncate(out.trim_end().len());
        out.push('\n');
        let l = &self.latency_ms;
        let _ = writeln!(
            out,
            "  latency ms    p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  mean {:.3}",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        );
        if let Some(error) = &self.redis_error {
            let _ = writeln!(out, "\n  Redis: no figures ({error})");
        }
        if let Some(redis) = &self.redis {
            self.render_redis(redis, &mut out);
        }
        out
    }

    /// The Redis section: what the measured run cost Redis per decision.
    fn render_redis(&self, redis: &RedisCost, out: &mut String) {
        let _ = writeln!(
            out,
            "\n  Redis, per decision (INFO deltas over the measured run)"
        );
        let _ = writeln!(
            out,
            "  commands      {:>12.2}   scripts {:.2}; commands a script calls count too",
            redis.calls_per_decision, redis.script_calls_per_decision
        );
        let _ = writeln!(
            out,
            "  server µs     {:>12.2}   commandstats; a script's time includes its commands",
            redis.usec_per_decision
        );
        let _ = writeln!(
            out,
            "  CPU µs        {:>12.2}   INFO cpu, main thread: commands, parsing and I/O",
            redis.cpu_usec_per_decision
        );
        for (name, cost) in &redis.commands {
            let _ = writeln!(
                out,
                "    {name:<20} {:>8.3} calls/decision  {:>7.2} µs/call",
                cost.calls as f64 / self.decisions.max(1) as f64,
                cost.usec as f64 / cost.calls.max(1) as f64
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# Commandstats\r\n\
        cmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_hmget:calls=10,usec=8,usec_per_call=0.80,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_info:calls=3,usec=90,usec_per_call=30.00\r\n\
        # CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\n\
        used_cpu_sys_main_thread:1.0\r\nused_cpu_user_main_thread:2.0\r\n";

    const AFTER: &str = "# Commandstats\r\n\
        cmdstat_evalsha:calls=110,usec=350,usec_per_call=3.18\r\n\
        cmdstat_hmget:calls=110,usec=48,usec_per_call=0.44\r\n\
        cmdstat_hset:calls=100,usec=30,usec_per_call=0.30\r\n\
        cmdstat_info:calls=4,usec=120,usec_per_call=30.00\r\n\
        cmdstat_config|resetstat:calls=1,usec=60,usec_per_call=60.00\r\n\
        # CPU\r\nused_cpu_sys:1.6\r\nused_cpu_user:2.6\r\n\
        used_cpu_sys_main_thread:1.0002\r\nused_cpu_user_main_thread:2.0006\r\n";

    fn snapshot(texts: &[&str]) -> RedisSnapshot {
        let mut s = RedisSnapshot::default();
        for t in texts {
            s.add_info(t);
        }
        s
    }

    #[test]
    fn script_time_is_the_server_time_and_admin_commands_are_left_out() {
        let cost = snapshot(&[BEFORE]).cost(&snapshot(&[AFTER]), 100);
        assert_eq!(cost.script_calls_per_decision, 1.0);
        assert_eq!(cost.calls_per_decision, 3.0);
        assert_eq!(cost.usec_per_decision, 3.0);
        assert!((cost.cpu_usec_per_decision - 8.0).abs() < 1e-6, "{cost:?}");
        assert_eq!(
            cost.commands.keys().collect::<Vec<_>>(),
            ["evalsha", "hmget", "hset"]
        );
    }

    #[test]
    fn without_scripts_every_command_counts_and_servers_add_up() {
        let node = "cmdstat_incrby:calls=100,usec=9\r\ncmdstat_expire:calls=100,usec=21\r\n\
            used_cpu_sys:0.0001\r\nused_cpu_user:0.0002\r\n";
        let after = snapshot(&[node, node]);
        let cost = RedisSnapshot::default().cost(&after, 100);
        assert_eq!(cost.calls_per_decision, 4.0);
        assert_eq!(cost.script_calls_per_decision, 0.0);
        assert_eq!(cost.usec_per_decision, 0.6);
        assert!((cost.cpu_usec_per_decision - 6.0).abs() < 1e-6, "{cost:?}");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(81_234_567), "81,234,567");
    }
}
