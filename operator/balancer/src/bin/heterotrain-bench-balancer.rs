//! `heterotrain-bench-balancer`: placeholder.
fn main() {}
