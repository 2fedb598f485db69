//! `ipamctl`'s shell completions and man page, as `cargo xtask completions` installs them.

use ipam_tests::workspace_binary;

fn ipamctl(args: &[&str]) -> String {
    let out = std::process::Command::new(workspace_binary("ipamctl"))
        .args(args)
        .output()
        .expect("run ipamctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn completions_and_man_page_cover_the_commands() {
    let bash = ipamctl(&["completions", "bash"]);
    for word in ["who-has", "pools", "apply", "announcements"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(ipamctl(&["completions", "zsh"]).contains("#compdef ipamctl"));
    let man = ipamctl(&["man"]);
    assert!(
        man.contains(".TH ipamctl") && man.contains("who\\-has"),
        "{man}"
    );
}
