//! drafs: the attributes of a pod's DRA-allocated devices, as files.

pub mod files;
pub mod metadata;
pub mod names;
pub mod objects;
pub mod resolve;
pub mod tree;
