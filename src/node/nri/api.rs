//! The messages of NRI (`nri.pkg.api.v1alpha1`) that drafs sends or reads,
//! with the fields it uses: written from the protocol's field numbers, each
//! field as the runtime sends it. A field drafs does not name is skipped
//! when read (protobuf's rule), so the runtime may send more.

use std::collections::BTreeMap;

/// The runtime's service, which the plugin calls.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The plugin's service, which the runtime calls.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterPluginRequest {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    /// Two digits: where the plugin is called among the others.
    #[prost(string, tag = "2")]
    pub plugin_idx: String,
    #[prost(string, tag = "3")]
    pub nri_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigureRequest {
    #[prost(string, tag = "1")]
    pub config: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// Milliseconds.
    #[prost(int64, tag = "4")]
    pub registration_timeout: i64,
    /// Milliseconds: how long the runtime waits for each call.
    #[prost(int64, tag = "5")]
    pub request_timeout: i64,
    #[prost(string, tag = "6")]
    pub nri_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigureResponse {
    /// The events subscribed to ([`Event::bit`]).
    #[prost(int32, tag = "2")]
    pub events: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SynchronizeRequest {
    #[prost(message, repeated, tag = "1")]
    pub pods: Vec<PodSandbox>,
    #[prost(message, repeated, tag = "2")]
    pub containers: Vec<Container>,
    /// More parts of the same synchronization follow.
    #[prost(bool, tag = "3")]
    pub more: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SynchronizeResponse {
    /// Echoes the request's `more`.
    #[prost(bool, tag = "2")]
    pub more: bool,
}

/// RunPodSandbox, StopPodSandbox and RemovePodSandbox: the pod alone.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub pod: Option<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(message, optional, tag = "1")]
    pub pod: Option<PodSandbox>,
    #[prost(message, optional, tag = "2")]
    pub container: Option<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(message, optional, tag = "1")]
    pub adjust: Option<ContainerAdjustment>,
}

/// What the plugin changes of a container before it is created: drafs only
/// adds mounts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAdjustment {
    #[prost(message, repeated, tag = "3")]
    pub mounts: Vec<Mount>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub uid: String,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(btree_map = "string, string", tag = "5")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "6")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(message, repeated, tag = "9")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "20")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub destination: String,
    #[prost(string, tag = "2")]
    pub r#type: String,
    #[prost(string, tag = "3")]
    pub source: String,
    #[prost(string, repeated, tag = "4")]
    pub options: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The events a plugin subscribes to (NRI's `Event` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    RunPodSandbox = 1,
    StopPodSandbox = 2,
    RemovePodSandbox = 3,
    CreateContainer = 4,
}

impl Event {
    /// Its bit in a subscription mask.
    pub fn bit(self) -> i32 {
        1 << (self as i32 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The bytes as NRI's Go types write them, for a mount and the events drafs subscribes to.
    #[test]
    fn fields_are_where_the_runtime_reads_them() {
        let mount = Mount {
            destination: "/dra".into(),
            r#type: "bind".into(),
            source: "/run/drafs/p".into(),
            options: vec!["ro".into()],
        };
        let adjust = CreateContainerResponse { adjust: Some(ContainerAdjustment { mounts: vec![mount] }) };
        let bytes = adjust.encode_to_vec();
        // field 1 (adjust) { field 3 (mounts) { 1: "/dra", 2: "bind", 3: "/run/drafs/p", 4: "ro" } }
        let mut want = vec![0x0a, 0x20, 0x1a, 0x1e, 0x0a, 0x04];
        want.extend(b"/dra");
        want.extend([0x12, 0x04]);
        want.extend(b"bind");
        want.extend([0x1a, 0x0c]);
        want.extend(b"/run/drafs/p");
        want.extend([0x22, 0x02]);
        want.extend(b"ro");
        assert_eq!(bytes, want);
        let mask = Event::RunPodSandbox.bit() | Event::RemovePodSandbox.bit() | Event::CreateContainer.bit();
        assert_eq!(mask, 0b1101);
        // A pod as the runtime sends it, with fields drafs does not read (IPs, 10) skipped.
        let mut pod = PodSandbox { id: "s1".into(), uid: "u1".into(), ..Default::default() }.encode_to_vec();
        pod.extend([0x52, 0x08]);
        pod.extend(b"10.0.0.1");
        let read = PodSandbox::decode(pod.as_slice()).unwrap();
        assert_eq!((read.id.as_str(), read.uid.as_str()), ("s1", "u1"));
    }
}
