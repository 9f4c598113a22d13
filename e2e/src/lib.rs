//! HeteroTrain's local control plane: a real etcd + kube-apiserver +
//! kube-scheduler + kube-controller-manager on loopback, built from Debian's
//! sources by `make setup`, for tests, the demo and trying the system on one
//! machine.

pub mod audit;
pub mod bench;
pub mod cluster;
pub mod crd;
pub mod datasets;
pub mod demo;
pub mod keeper;
pub mod nodesim;
pub mod paths;
pub mod pki;
pub mod pod_security;
pub mod ports;
pub mod prometheus;
pub mod proxy;
pub mod system;
pub mod volumes;
pub mod wait;

pub use cluster::{ClusterOptions, LocalCluster};
pub use paths::cache_dir;
