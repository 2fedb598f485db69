//! The configuration's words for the datapath (`[interfaces.<name>] attach`,
//! `[datapath] ebpf_log_level`) mapped onto the datapath's own: `ipam-datapath` owns its
//! vocabulary and knows nothing of the configuration (nor builds what it depends on), and
//! each match is exhaustive, so a word added on either side fails to compile until it is
//! mapped here.

use ipam_config as config;
use ipam_datapath as datapath;

/// How the responder is attached to an interface, as configured.
pub fn attach_mode(mode: config::AttachMode) -> datapath::AttachMode {
    match mode {
        config::AttachMode::Auto => datapath::AttachMode::Auto,
        config::AttachMode::XdpNative => datapath::AttachMode::XdpNative,
        config::AttachMode::XdpGeneric => datapath::AttachMode::XdpGeneric,
        config::AttachMode::Tc => datapath::AttachMode::Tc,
    }
}

/// Which eBPF log statements are kept, as configured.
pub fn ebpf_log_level(level: config::EbpfLogLevel) -> datapath::EbpfLogLevel {
    match level {
        config::EbpfLogLevel::Off => datapath::EbpfLogLevel::Off,
        config::EbpfLogLevel::Error => datapath::EbpfLogLevel::Error,
        config::EbpfLogLevel::Warn => datapath::EbpfLogLevel::Warn,
        config::EbpfLogLevel::Info => datapath::EbpfLogLevel::Info,
        config::EbpfLogLevel::Debug => datapath::EbpfLogLevel::Debug,
        config::EbpfLogLevel::Trace => datapath::EbpfLogLevel::Trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each word maps onto the datapath's word of the same name (no two arms swapped).
    #[test]
    fn each_word_maps_onto_its_namesake() {
        for mode in [
            config::AttachMode::Auto,
            config::AttachMode::XdpNative,
            config::AttachMode::XdpGeneric,
            config::AttachMode::Tc,
        ] {
            assert_eq!(format!("{mode:?}"), format!("{:?}", attach_mode(mode)));
        }
        for level in [
            config::EbpfLogLevel::Off,
            config::EbpfLogLevel::Error,
            config::EbpfLogLevel::Warn,
            config::EbpfLogLevel::Info,
            config::EbpfLogLevel::Debug,
            config::EbpfLogLevel::Trace,
        ] {
            assert_eq!(format!("{level:?}"), format!("{:?}", ebpf_log_level(level)));
        }
        assert_eq!(
            attach_mode(config::AttachMode::default()),
            datapath::AttachMode::default()
        );
        assert_eq!(
            ebpf_log_level(config::EbpfLogLevel::default()),
            datapath::EbpfLogLevel::default()
        );
    }
}
