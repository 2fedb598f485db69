//! `cargo xtask fuzz <target|all> --seconds N`: runs cargo-fuzz targets (fuzz/fuzz_targets) for a
//! bounded time each and reports how many inputs each one executed. Installs cargo-fuzz when it
//! is missing. A crash fails the run; libFuzzer leaves the input under fuzz/artifacts/<target>/,
//! and the finding becomes a regression test next to the code it broke.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::cmd::{exec, output, workspace_root};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Target {
    /// CNI environment and stdin parsing.
    CniInvocation,
    /// The local API's JSON (round trips).
    ApiJson,
    /// ipamd's TOML configuration.
    ConfigToml,
    /// The allocation log's replay of arbitrary bytes.
    AllocLogReplay,
    /// The userspace ARP/NDP frame parsers.
    Frames,
    /// The L2 responder (XDP and TC) through BPF_PROG_TEST_RUN; needs root and bpffs.
    Responder,
    /// Every target in turn.
    All,
}

impl Target {
    const EACH: [Self; 6] = [
        Self::CniInvocation,
        Self::ApiJson,
        Self::ConfigToml,
        Self::AllocLogReplay,
        Self::Frames,
        Self::Responder,
    ];

    fn bin(self) -> &'static str {
        match self {
            Self::CniInvocation => "cni_invocation",
            Self::ApiJson => "api_json",
            Self::ConfigToml => "config_toml",
            Self::AllocLogReplay => "alloclog_replay",
            Self::Frames => "frames",
            Self::Responder => "responder",
            Self::All => unreachable!("`all` is expanded before running"),
        }
    }
}

pub(crate) fn run(target: Target, seconds: u64) -> anyhow::Result<()> {
    install_cargo_fuzz()?;
    let targets: Vec<Target> = if target == Target::All {
        Target::EACH.to_vec()
    } else {
        vec![target]
    };
    let mut report = Vec::new();
    for t in targets {
        let result = run_one(t.bin(), seconds);
        // The responder target cannot drop its pins (libFuzzer exits the process).
        remove_fuzz_pins();
        report.push((t.bin(), result?));
    }
    println!("fuzz: executions per target ({seconds} s each):");
    for (bin, runs) in &report {
        println!("  {bin:<16} {runs}");
    }
    let line: Vec<String> = report
        .iter()
        .map(|(bin, runs)| format!("fuzz_{bin}_runs={runs}"))
        .collect();
    println!("{}", line.join(" "));
    Ok(())
}

/// Runs one target for `seconds` and returns how many inputs it executed.
fn run_one(bin: &str, seconds: u64) -> anyhow::Result<u64> {
    let root = workspace_root();
    let corpus = root.join("fuzz/corpus").join(bin);
    std::fs::create_dir_all(&corpus)
        .with_context(|| format!("cannot create the corpus directory {}", corpus.display()))?;
    // Committed seeds (inputs of the shapes the target reads, so a short run starts where the
    // parsers branch) are read beside the corpus; new finds go to the corpus only.
    let seeds = root.join("fuzz/seeds").join(bin);
    let mut child = Command::new("cargo")
        .current_dir(root.join("fuzz"))
        .args(["+nightly", "fuzz", "run", bin])
        .arg(&corpus)
        .args(seeds.is_dir().then_some(&seeds))
        .args([
            "--",
            &format!("-max_total_time={seconds}"),
            "-print_final_stats=1",
        ])
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start cargo fuzz for {bin}"))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let mut runs = None;
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        eprintln!("{line}");
        // libFuzzer's closing statistics: "stat::number_of_executed_units: 123456".
        if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
            runs = n.trim().parse().ok();
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "fuzz target {bin} failed ({status}); the input that broke it is under \
             fuzz/artifacts/{bin}/: reproduce with `cargo +nightly fuzz run {bin} <file>` in \
             fuzz/, fix the code, and add the input as a regression test"
        );
    }
    runs.with_context(|| format!("fuzz target {bin} printed no execution count"))
}

fn install_cargo_fuzz() -> anyhow::Result<()> {
    if output(Command::new("cargo").args(["fuzz", "--version"])).is_some() {
        return Ok(());
    }
    println!("fuzz: installing cargo-fuzz");
    exec(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

fn remove_fuzz_pins() {
    let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("ipam-fuzz-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
