//! HeteroTrain trainer: heterogeneous data-parallel training on libtorch
//! (tch) with PyTorch's own c10d collectives through a small C++ shim.

pub mod c10d;
pub mod checkpoint;
pub mod cli;
pub mod control;
pub mod data;
pub mod error;
pub mod local_balance;
pub mod log;
pub mod metrics;
pub mod models;
pub mod nvml;
pub mod optim;
pub mod plan_source;
pub mod plan_watch;
pub mod profile;
pub mod sampler;
pub mod shard;
pub mod train;

pub use error::{Result, TrainerError};
