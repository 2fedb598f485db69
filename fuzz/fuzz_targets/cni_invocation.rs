//! CNI input as a runtime hands it over: environment variables and the network configuration.
//! Input: `KEY=VALUE` lines up to the first NUL byte, then the configuration. Whatever comes in,
//! parsing answers with a result or a CNI error, never a panic.
#![no_main]

use ipam_cni::invocation::{Invocation, NetConf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (env, stdin) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&[][..], data),
    };
    let env = String::from_utf8_lossy(env);
    let vars: Vec<(&str, &str)> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |key: &str| {
        vars.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| (*v).to_owned())
    };
    if let Ok(invocation) = Invocation::from_env(get) {
        let _ = invocation.attachment("fuzznet");
        let _ = invocation.pod();
    }
    if let Ok(conf) = NetConf::parse(stdin) {
        let _ = conf.settings();
    }
});
