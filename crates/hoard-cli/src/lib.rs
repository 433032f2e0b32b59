//! hoard's command-line clients: the admin CLI (`hoard caches`, `hoard status`), the runner
//! set-up (`hoard runner`), `hoard doctor` and `hoard health`. They speak to a server over
//! HTTP and share only `hoard-model`'s records with it.

pub mod admin_cli;
pub mod doctor;
pub mod gocache;
pub mod health;
pub mod runner;
