//! The Kubernetes store: the project's resources as custom resources over kube-rs, so the
//! controllers written against `ipam_core::store::Store` run on a Kubernetes cluster unchanged.

mod conditions;
pub mod crd;
mod endpoint_slices;
pub mod events;
mod lease;
pub mod node;
pub mod pod_readiness;
pub mod pods;
#[cfg(feature = "testing")]
pub mod real_api;
mod secret;
mod service;
pub mod store;
#[cfg(feature = "testing")]
pub mod test_api;
#[cfg(feature = "testing")]
pub mod testing;
pub mod workload;

pub use endpoint_slices::SERVICE_NAME_LABEL;
pub use service::{
    IPS_ANNOTATION, IPS_ANNOTATIONS, POOL_ANNOTATIONS, SHARING_ANNOTATIONS,
    SHARING_CROSS_NAMESPACE_ANNOTATIONS, SHARING_KEY_ANNOTATION,
};
pub use store::KubeStore;
