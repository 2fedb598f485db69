//! Restoring the node's allocations at start: its own pool's, and in multi-pool mode every
//! pool it has an allocation log of.

use std::path::Path;

use ipam_config::IpamSettings;
use ipam_core::pod::{agent::NodeAgent, multipool::Watermarks, pool::IpamMode};

use super::IpamRuntimeError;

pub(super) fn mkdir(path: &Path) -> Result<(), IpamRuntimeError> {
    std::fs::create_dir_all(path).map_err(|source| IpamRuntimeError::Dir {
        path: path.to_owned(),
        source,
    })
}

/// The allocation log of a pool on the node.
const ALLOC_LOG_SUFFIX: &str = ".alloc.log";

/// The pools whose state the node restores at start: its own, and in multi-pool mode every
/// pool it has an allocation log of.
pub(super) fn pools_to_restore(settings: &IpamSettings) -> Result<Vec<String>, IpamRuntimeError> {
    let mut pools = vec![settings.infra_pool.clone()];
    if settings.mode != IpamMode::MultiPool {
        return Ok(pools);
    }
    let dir_error = |source| IpamRuntimeError::Dir {
        path: settings.state_dir.clone(),
        source,
    };
    for entry in std::fs::read_dir(&settings.state_dir).map_err(dir_error)? {
        let name = entry.map_err(dir_error)?.file_name();
        if let Some(pool) = name.to_str().and_then(|n| n.strip_suffix(ALLOC_LOG_SUFFIX))
            && !pools.iter().any(|p| p == pool)
        {
            pools.push(pool.to_owned());
        }
    }
    Ok(pools)
}

/// Opens (restoring) the node's allocator of `pool`.
pub(super) fn open_agent(
    settings: &IpamSettings,
    pool: &str,
) -> Result<NodeAgent, IpamRuntimeError> {
    let (agent, restored) = NodeAgent::open(
        &settings.state_dir,
        &settings.node_name,
        pool,
        settings.mode,
        Watermarks {
            pre_allocate: settings.pre_allocate_for(pool),
        },
        settings.pod_cidrs.clone(),
    )?;
    tracing::info!(
        node = settings.node_name.as_str(),
        mode = settings.mode.name(),
        pool,
        blocks = restored.blocks,
        allocations = restored.allocations,
        "IPAM state restored"
    );
    Ok(agent)
}
