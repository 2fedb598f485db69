//! ipamd's configuration file: any text is accepted or refused with an error, never a panic.
#![no_main]

use ipam_config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::parse(std::path::Path::new("fuzz.toml"), text);
    }
});
