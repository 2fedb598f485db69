//! Named network namespaces, made and removed as `ip netns add` / `ip netns del` do, so either
//! tool can see and remove what the other made.
//!
//! A network namespace lives while something refers to it. A named one is kept alive by a bind
//! mount of the namespace onto a file under [`NETNS_DIR`]; removing it unmounts and deletes that
//! file, and the kernel frees the namespace (and every link in it) once its last user is gone.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::{
    mount::{MntFlags, MsFlags},
    sched::CloneFlags,
};

use crate::NetlinkError;

/// Where named network namespaces are, for `ip netns` and container runtimes alike.
pub const NETNS_DIR: &str = "/run/netns";

/// The path of the named namespace `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Creates the network namespace `name` and returns its path. Like any new namespace it holds
/// only a loopback link, down. Fails if a namespace of that name exists.
pub fn create(name: &str) -> Result<PathBuf, NetlinkError> {
    let path = path(name);
    let what = || format!("cannot create network namespace {}", path.display());
    fs::create_dir_all(NETNS_DIR).map_err(|e| NetlinkError::new(what(), e))?;
    fs::File::options()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| NetlinkError::new(what(), e))?;
    // unshare moves only the calling thread into the new namespace: a thread of its own does
    // it, so the caller's threads never change namespace, and the thread's end leaves the
    // namespace held by the mount alone.
    let made = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
                nix::mount::mount(
                    Some("/proc/thread-self/ns/net"),
                    &path,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
            })
            .join()
            .unwrap_or(Err(nix::Error::EIO))
    });
    if let Err(e) = made {
        let _ = fs::remove_file(&path);
        return Err(NetlinkError::new(what(), e.into()));
    }
    Ok(path)
}

/// Removes the network namespace `name`; removing one that is not there is not an error.
pub fn delete(name: &str) -> Result<(), NetlinkError> {
    let path = path(name);
    let what = || format!("cannot delete network namespace {}", path.display());
    match nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (left by a failed create); ENOENT: not there at all.
        Ok(()) | Err(nix::Error::EINVAL | nix::Error::ENOENT) => {}
        Err(e) => return Err(NetlinkError::new(what(), e.into())),
    }
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(NetlinkError::new(what(), e)),
        _ => Ok(()),
    }
}
