//! Clients of the cache protocol that hoard did not write, each driven against a hoard server
//! as its users run it: one test binary for all of them (one link, not four), a module each.
//! Without a client its tests skip, except under `HOARD_TEST_REQUIRE_CLIENTS=1` (CI);
//! `scripts/clients` installs them.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

#[path = "../common/mod.rs"]
mod common;

mod azcopy;
mod build_caches;
mod go_actions_cache;
mod opendal_ghac;
mod sccache;
