//! What the processes cost, from /proc and from their metrics' text.

/// The sum of `name`'s samples whose labels contain `labels` (all of them for "").
pub(crate) fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name && rest.contains(labels)
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// utime + stime of each process, in clock ticks.
pub(crate) fn cpu_ticks(pids: &[i32]) -> Vec<u64> {
    pids.iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // The fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
            let field = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            field(11) + field(12)
        })
        .collect()
}

pub(crate) fn rss_mb(pid: i32) -> f64 {
    proc_status_kb(&format!("/proc/{pid}/status"), "VmRSS:") / 1024.0
}

pub(crate) fn mem_total_mb() -> u64 {
    (proc_status_kb("/proc/meminfo", "MemTotal:") / 1024.0) as u64
}

fn proc_status_kb(file: &str, key: &str) -> f64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// "mean (min–max)".
pub(crate) fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.2} ({min:.2}–{max:.2})", mean(v))
}

/// Each process's CPU between two `cpu_ticks` readings `seconds` apart, in % of one core.
pub(crate) fn cpu_pct(before: &[u64], after: &[u64], seconds: f64) -> Vec<f64> {
    let ticks_per_s = ticks_per_s();
    before
        .iter()
        .zip(after)
        .map(|(b, a)| 100.0 * a.saturating_sub(*b) as f64 / ticks_per_s / seconds)
        .collect()
}

/// Clock ticks per second, the unit of `cpu_ticks` and `machine_ticks`.
pub(crate) fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// All the machine's CPUs' time since boot as /proc/stat counts it, in ticks: (busy, all),
/// busy being everything but idle and I/O wait.
pub(crate) fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    // user nice system idle iowait irq softirq steal
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (all.saturating_sub(idle), all)
}
