//! The images every node has before any pod starts (no registry is reachable): the project's
//! own (`cargo xtask image` builds it; `IPAM_IMAGE` names it), and two made here from Debian's
//! busybox-static with podman: the pause image of every pod sandbox, and the web server the
//! lab's Deployments run (busybox httpd on port 80, answering with its node's name).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub const PAUSE: &str = "localhost/ipam-lab-pause:1";
pub const WEB: &str = "localhost/ipam-lab-web:1";
const BUSYBOX: &str = "/bin/busybox";

/// The project's image, as `cargo xtask image` tags it unless `IPAM_IMAGE` says otherwise.
pub fn project_image() -> String {
    std::env::var("IPAM_IMAGE").unwrap_or_else(|_| "localhost/ipam-ebpf:0.1.0".to_owned())
}

fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]);
    c
}

fn run(command: &mut Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run podman: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the lab's images and saves them with the project's into `dir` (the archives that
/// `archives` lists, which every node imports when it boots). Panics when the project's
/// image is missing, saying how to build it.
pub fn prepare(dir: &Path) {
    let context = dir.join("image-context");
    std::fs::create_dir_all(&context).expect("an image context");
    std::fs::copy(BUSYBOX, context.join("busybox")).unwrap_or_else(|e| {
        panic!("{BUSYBOX}: {e} (install Debian's busybox-static: cargo xtask lab kube does)")
    });
    let files = [
        (
            PAUSE,
            "FROM scratch\nCOPY busybox /busybox\n\
             ENTRYPOINT [\"/busybox\", \"sleep\", \"2147483647\"]\n",
        ),
        (
            WEB,
            "FROM scratch\nCOPY busybox /bin/busybox\n\
             RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n\
             ENTRYPOINT [\"/bin/sh\", \"-c\", \"mkdir -p /www && printf %s \\\"$NODE_NAME\\\" > \
             /www/index.html && exec httpd -f -p 80 -h /www\"]\n",
        ),
    ];
    for (tag, containerfile) in files {
        let file = context.join("Containerfile");
        std::fs::write(&file, containerfile).expect("a Containerfile");
        run(
            podman()
                .args(["build", "-q", "--network", "none", "-f"])
                .arg(&file)
                .args(["-t", tag])
                .arg(&context),
            &format!("build {tag}"),
        );
    }
    run(
        podman()
            .args(["save", "-m", "--format", "docker-archive", "-o"])
            .arg(dir.join("lab-images.tar"))
            .args([PAUSE, WEB]),
        "save the lab's images",
    );
    let project = project_image();
    if let Err(why) = project_image_exists() {
        panic!("{why}");
    }
    run(
        podman()
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(dir.join("project-image.tar"))
            .arg(&project),
        &format!("save {project}"),
    );
}

/// Whether podman's store has the project's image, or a sentence saying how to build it.
pub fn project_image_exists() -> Result<(), String> {
    let project = project_image();
    let exists = podman()
        .args(["image", "exists", &project])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        Ok(())
    } else {
        Err(format!(
            "the project's image {project} is not in podman's store: build it with `cargo \
             xtask image --local-base` (cargo xtask lab kube does)"
        ))
    }
}

/// The archives `prepare` wrote.
pub fn archives(dir: &Path) -> Vec<PathBuf> {
    ["lab-images.tar", "project-image.tar"]
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.is_file())
        .collect()
}
