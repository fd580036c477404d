//! The names of the tree's contract (see the README's "The tree"): what a
//! reader, `probe` and `exec` rely on. Names starting with `.` are drafs's own
//! (DRA attribute names cannot start with one).

/// Exists once everything asked for is resolved.
pub const READY: &str = ".ready";
/// The whole resolution at the top; a device's record in its directory.
pub const RECORD: &str = ".json";
/// A device's identity.
pub const DRIVER: &str = ".driver";
pub const POOL: &str = ".pool";
pub const DEVICE: &str = ".device";
/// The allocated request, `gpu` or, for a prioritized-list subrequest, `gpu/large`.
pub const REQUEST: &str = ".request";
/// Only for shared (consumable capacity) allocations.
pub const SHARE_ID: &str = ".shareID";
/// `true`, only for a device allocated with admin access (`adminAccess: true`).
pub const ADMIN_ACCESS: &str = ".adminAccess";
/// The device's taints from its slice (`key=value:effect`, joined with `,`); absent when it has none.
pub const TAINTS: &str = ".taints";
/// Capacity quantities live under this directory of a device.
pub const CAPACITY_DIR: &str = ".capacity";
/// The share of the capacity a shared allocation consumed, named like `.capacity`.
pub const CONSUMED_DIR: &str = ".consumed";
/// The device's health as the kubelet reports it (`Healthy`, `Unhealthy`, `Unknown`),
/// and the driver's message about it; absent while nothing reports on the device.
pub const HEALTH: &str = ".health";
pub const HEALTH_MESSAGE: &str = ".healthMessage";
/// The claim status's device data (network status) lives under this directory.
pub const STATUS_DIR: &str = ".status";
pub const STATUS_INTERFACE_NAME: &str = ".status/interfaceName";
pub const STATUS_IPS: &str = ".status/ips";
pub const STATUS_HARDWARE_ADDRESS: &str = ".status/hardwareAddress";
pub const STATUS_DATA: &str = ".status/data";
/// The members of `.status/data` as files (an object member is a directory);
/// beside the raw file, which stays as it was.
pub const STATUS_DATA_DIR: &str = ".status/data.d";
