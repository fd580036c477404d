//! Shared test support, by what it supports: the test API server
//! (`apiserver`, with `objects` to fill it), the real control plane
//! (`controlplane`) and scenarios on it (`cluster`), the real node (`node`),
//! the webhook (`webhook`, `tls`), and running the binary (`process`). The
//! helpers are re-exported here, so tests use `support::...` whatever file
//! holds them. A crate of its own (compiled once for every test binary and
//! benchmark); it runs the drafs binary and never links the library.

pub mod apiserver;
pub mod cluster;
pub mod controlplane;
pub mod helm;
pub mod node;
pub mod objects;
pub mod process;
pub mod tls;
pub mod webhook;

pub use apiserver::{Fault, Res, TestApi, WatchFault, sequential_round_trips};
pub use objects::*;
pub use process::*;
