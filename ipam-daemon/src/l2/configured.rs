//! What the daemon's file says about announcing, and the `Announcements` it makes with the
//! Service IPs this node owns (`owners`): each IP on its interfaces, with each interface's
//! attach mode, for the responder to apply.

use std::collections::BTreeMap;

use ipam_config::{AnnouncementConfig, Config};
use ipam_datapath::AttachMode;

use super::announcements::{Announcements, OwnedIps};
use crate::datapath_settings;

/// What the daemon's configuration says about announcing: the IPs it lists, and how the
/// responder is attached on each interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Configured {
    pub ips: Vec<AnnouncementConfig>,
    attach: BTreeMap<String, AttachMode>,
}

impl Configured {
    pub fn of(config: &Config) -> Self {
        Self {
            ips: config.announcements.clone(),
            attach: config
                .interfaces
                .iter()
                .map(|(name, i)| (name.clone(), datapath_settings::attach_mode(i.attach)))
                .collect(),
        }
    }

    fn attach_mode(&self, interface: &str) -> AttachMode {
        self.attach.get(interface).copied().unwrap_or_default()
    }

    /// The announcements of these settings and `services`.
    pub fn with(&self, services: &OwnedIps) -> Announcements {
        let mut out = Announcements::default();
        let configured = self.ips.iter().map(|a| (a.ip, a.interface.as_str()));
        let owned = services
            .iter()
            .flat_map(|(ip, o)| o.interfaces.iter().map(|i| (*ip, i.as_str())));
        for (ip, interface) in configured.chain(owned) {
            out.add(ip, interface, self.attach_mode(interface));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2::announcements::OwnedIp;

    #[test]
    fn configured_and_owned_ips_merge_with_the_interfaces_attach_modes() {
        let config = Config::parse(
            std::path::Path::new("announce-test.toml"),
            r#"
            [[announcement]]
            ip = "192.0.2.10"
            interface = "eth0"

            [interfaces.eth1]
            attach = "tc"
            "#,
        )
        .expect("config");
        let configured = Configured::of(&config);
        let owned: OwnedIps = [(
            "192.0.2.20".parse().unwrap(),
            OwnedIp {
                service: "default/web".to_owned(),
                interfaces: vec!["eth1".to_owned()],
            },
        )]
        .into_iter()
        .collect();
        let wanted = configured.with(&owned);
        let by: Vec<_> = wanted
            .interfaces()
            .map(|(i, on)| {
                (
                    i.to_owned(),
                    on.attach,
                    on.ips.iter().copied().collect::<Vec<_>>(),
                )
            })
            .collect();
        assert_eq!(
            by,
            [
                (
                    "eth0".to_owned(),
                    AttachMode::Auto,
                    vec!["192.0.2.10".parse().unwrap()]
                ),
                (
                    "eth1".to_owned(),
                    AttachMode::Tc,
                    vec!["192.0.2.20".parse().unwrap()]
                ),
            ]
        );
    }
}
