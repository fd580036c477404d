//! drafs: the attributes of a pod's DRA-allocated devices, as files.

pub mod admission;
pub mod api;
pub mod app;
pub mod cli;
pub mod envvars;
pub mod events;
pub mod files;
pub mod fsmodel;
pub mod fuse;
pub mod inject;
pub mod layout;
pub mod manifests;
pub mod metadata;
pub mod metadata_dir;
pub mod metrics;
pub mod names;
pub mod objects;
pub mod reconcile;
pub mod resolve;
pub mod slices;
pub mod source;
pub mod store;
pub mod supervisor;
pub mod tree;
pub mod webhook;
