//! The Kubernetes store: the project's resources as custom resources over kube-rs, so the
//! controllers written against `ipam_core::store::Store` run on a Kubernetes cluster unchanged.

pub mod crd;
