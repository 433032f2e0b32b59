//! hoard: a self-hosted cache server for GitHub Actions.
//!
//! The `hoard` binary is made of crates by role: `hoard-model` (the records server and clients
//! share), `hoard-server`, `hoard-cli` (the command-line clients), `hoard-edge` (a byte cache beside the
//! runners, in front of a hoard) and `hoard-bench`. This crate
//! puts them under one name, for the binary and the integration tests.

pub use hoard_bench as bench;
pub use hoard_cli::{admin_cli, doctor, gocache, health, runner};
pub use hoard_edge as edge;
pub use hoard_server::*;
