//! `ipam-sim`: runs seeds of the whole-cluster simulation (`cargo xtask sim`).
//!
//! ```text
//! ipam-sim [--seeds N] [--first S] [--nodes K]     N seeds from S (default 100 from 1, 5 nodes)
//! ipam-sim --seed S [--events 0,3,7] [--nodes K]  one seed, all its events or those listed
//!   --no-shrink    a failing seed is printed with its replay command, not shrunk
//!   --every-step   look at every step of 1 ms, every agent at each (slow; the same runs)
//! ```
//! A failing seed is shrunk to the fewest events that still fail and printed with the command
//! that replays it; the exit status is 1. The last line holds the figures as `key=value`.

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use ipam_sim::{Outcome, run_events, run_seed, scenario, schedule::Stepping, shrink::shrink};

struct Args {
    first: u64,
    seeds: u64,
    nodes: usize,
    one: Option<u64>,
    events: Option<Vec<usize>>,
    shrink: bool,
    stepping: Stepping,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        first: 1,
        seeds: 100,
        nodes: 5,
        one: None,
        events: None,
        shrink: true,
        stepping: Stepping::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--seeds" => args.seeds = number(value()?)?,
            "--first" => args.first = number(value()?)?,
            "--nodes" => {
                args.nodes = usize::try_from(number(value()?)?).map_err(|e| e.to_string())?;
                if !(3..=1_000).contains(&args.nodes) {
                    return Err(format!("--nodes {}: between 3 and 1000", args.nodes));
                }
            }
            "--seed" => args.one = Some(number(value()?)?),
            "--events" => {
                let list = value()?;
                let parsed: Result<Vec<usize>, _> =
                    list.split(',').map(str::parse::<usize>).collect();
                args.events = Some(parsed.map_err(|e| format!("--events {list}: {e}"))?);
            }
            "--no-shrink" => args.shrink = false,
            "--every-step" => args.stepping = Stepping::EveryStep,
            other => return Err(format!("unknown argument {other}; see the file's comment")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("ipam-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let config = scenario::Config {
        stepping: args.stepping,
        ..scenario::Config::with_nodes(args.nodes)
    };
    if let Some(seed) = args.one {
        let all = scenario::events(&config, seed);
        let chosen: Vec<_> = match &args.events {
            Some(list) => list.iter().filter_map(|i| all.get(*i).cloned()).collect(),
            None => all,
        };
        for e in &chosen {
            println!("  {e}");
        }
        let outcome = run_events(&config, seed, &chosen);
        return report_one(&outcome);
    }
    let started = Instant::now();
    let mut events: BTreeMap<&str, u64> = BTreeMap::new();
    let mut checks: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut steps, mut decisions, mut failed) = (0u64, 0u64, 0u64);
    let mut simulated = std::time::Duration::ZERO;
    for seed in args.first..args.first + args.seeds {
        let outcome = run_seed(&config, seed);
        for (k, v) in &outcome.exercised.events {
            *events.entry(k).or_default() += v;
        }
        for (k, v) in &outcome.exercised.checks {
            *checks.entry(k).or_default() += v;
        }
        steps += outcome.exercised.steps;
        simulated += outcome.exercised.simulated;
        decisions += outcome.exercised.decisions;
        if let Some(violation) = outcome.violation.as_ref().filter(|_| !args.shrink) {
            failed += 1;
            print!("seed {seed} fails (not shrunk): {violation}");
            println!(
                "replay: cargo xtask sim --nodes {} --seed {seed}",
                args.nodes
            );
        } else if outcome.violation.is_some() {
            failed += 1;
            let (kept, shrunk) = shrink(&config, seed, &outcome);
            let all = scenario::events(&config, seed);
            println!(
                "seed {seed} fails; shrunk to {} of {} events:",
                kept.len(),
                all.len()
            );
            for i in &kept {
                println!("  [{i}] {}", all[*i]);
            }
            if let Some(v) = &shrunk.violation {
                print!("{v}");
            }
            let list: Vec<String> = kept.iter().map(ToString::to_string).collect();
            println!(
                "replay: cargo xtask sim --nodes {} --seed {seed} --events {}",
                args.nodes,
                list.join(",")
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("events exercised:");
    for (k, v) in &events {
        println!("  {k}: {v}");
    }
    println!("invariant checks:");
    for (k, v) in &checks {
        println!("  {k}: {v}");
    }
    println!(
        "nodes={} seeds={} failed={failed} seeds_per_s={} steps_checked={steps} \
         simulated_s={:.0} decisions={decisions}",
        args.nodes,
        args.seeds,
        three_figures(args.seeds as f64 / secs),
        simulated.as_secs_f64()
    );
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `x` to three significant figures: a seed at 1,000 nodes takes minutes, and `0.00` seeds
/// a second says nothing.
fn three_figures(x: f64) -> String {
    let magnitude = if x > 0.0 { x.log10().floor() } else { 0.0 };
    let decimals = (2.0 - magnitude).clamp(0.0, 9.0) as usize;
    format!("{x:.decimals$}")
}

fn report_one(outcome: &Outcome) -> ExitCode {
    match &outcome.violation {
        Some(v) => {
            print!("{v}");
            ExitCode::from(1)
        }
        None => {
            println!(
                "passed: steps_checked={} simulated_s={:.3} decisions={} happenings={:016x}",
                outcome.exercised.steps,
                outcome.exercised.simulated.as_secs_f64(),
                outcome.exercised.decisions,
                outcome.exercised.happenings
            );
            ExitCode::SUCCESS
        }
    }
}
